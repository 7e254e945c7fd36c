"""On PYTHONPATH with SPLITS_DIR set: each torchrun rank counts its torch.distributed.split_group calls and writes
the count to SPLITS_DIR/rank<RANK>-<pid> at exit (docs/perf-notes.md, "The strata.torch suite at 4 ranks under
torchrun": the splits of the 4-rank suite before and after dropped engines were destroyed)."""
import atexit
import os

_dir = os.environ.get("SPLITS_DIR")
if _dir and "RANK" in os.environ:
    _count = [0]
    import torch.distributed as _dist

    _real = _dist.split_group

    def _counted(*args, **kwargs):
        _count[0] += 1
        return _real(*args, **kwargs)

    _dist.split_group = _counted

    @atexit.register
    def _write():
        with open(os.path.join(_dir, f"rank{os.environ['RANK']}-{os.getpid()}"), "w", encoding="ascii") as f:
            f.write(str(_count[0]))
