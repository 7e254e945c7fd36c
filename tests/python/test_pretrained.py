"""engine.load_pretrained(dir): a Hugging Face checkpoint read straight into the shards (Note [Pretrained into
shards]). A model created sharded and loaded equals transformers' from_pretrained of the same directory, bit for
bit, from one file or from an index and its shards, in fp32, bf16 and fp16; each rank reads only the elements
its shards keep (at stage 3 the ranks' reads partition the parameters); a missing or extra tensor, a wrong shape,
a truncated file and a bad index are clear errors naming the file and the tensor on every rank; and random
corruptions of a file's header are always either a valid file or such an error."""
import json
import os
import random
import struct

import pytest
import torch
from safetensors.torch import save_file

import strata.torch as st
from common import config, on_rank_0, shared_dir, world
from models import TinyLM, hf_builders
from strata.torch import _pretrained
from strata.torch._pretrained import CheckpointError


def barrier():
    world().Barrier()


def bits(t):
    return t.detach().contiguous().flatten().view(torch.uint8)


def write_checkpoint(path, name, seed, dtype=None, max_shard_size="50GB"):
    """Rank 0 saves a plain transformers model (seed `seed`) with its save_pretrained; all ranks wait."""
    def save():
        torch.manual_seed(seed)
        m = hf_builders()[name]()
        if dtype is not None:
            m = m.to(dtype)
        m.save_pretrained(path, max_shard_size=max_shard_size)
    on_rank_0(save)


@pytest.mark.parametrize("name,shards", [("gpt2", "20KB"), ("llama", "50GB"), ("bert", "20KB"), ("t5", "20KB"),
                                         ("vit", "20KB"), ("mixtral", "20KB")])
def test_loaded_equals_from_pretrained(name, shards, tmp_path):
    path = os.path.join(shared_dir(tmp_path), name)
    write_checkpoint(path, name, seed=1, max_shard_size=shards)
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json" if shards == "20KB" else
                                       "model.safetensors"))
    torch.manual_seed(2)  # other initial values, all overwritten
    engine = st.shard(hf_builders()[name], config(3))
    assert engine.load_pretrained(path) == {"missing_keys": [], "unexpected_keys": []}
    state = engine.full_state_dict()
    ref = type(engine.model).from_pretrained(path).state_dict()
    assert state.keys() == ref.keys()
    for k in ref:
        assert torch.equal(bits(state[k]), bits(ref[k])), k
    engine.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoints_are_converted(dtype, tmp_path):
    path = os.path.join(shared_dir(tmp_path), "half")
    write_checkpoint(path, "gpt2", seed=3, dtype=dtype)
    engine = st.shard(hf_builders()["gpt2"], config(3))
    engine.load_pretrained(path)
    state = engine.full_state_dict()
    ref = type(engine.model).from_pretrained(path, dtype=dtype).state_dict()
    for k in ref:
        assert state[k].dtype == torch.float32 and torch.equal(state[k], ref[k].float()), k
    engine.close()


def held_elements(engine):
    """{parameter name: (first, last) elements of it this rank keeps} (strata_engine_held_range)."""
    import ctypes
    from strata import _capi
    ids = {id(p): n for n, p in engine.model.named_parameters()}
    out = {}
    for u in engine.units:
        begin, end = _capi.c_uint64(), _capi.c_uint64()
        _capi.check(_capi.lib.strata_engine_held_range(engine.handle, u.id, ctypes.byref(begin), ctypes.byref(end)))
        for i, p in enumerate(u.spec.params):
            offset, numel = u.layout.offsets[i], u.layout.numels[i]
            out[ids[id(p)]] = (max(begin.value, offset) - offset, max(min(end.value, offset + numel) - offset, 0))
    return out


@pytest.mark.parametrize("name", ["gpt2", "mixtral"])
@pytest.mark.parametrize("stage", [1, 3])
def test_each_rank_reads_only_what_it_keeps(stage, name, tmp_path):
    """The bytes each rank reads, counted by the library's reader (the I/O queue's own count): exactly the bytes
    of the elements it keeps; at stage 3 the ranks' reads together are the parameters' bytes once (they partition
    them), at stage 1 (parameters replicated) every rank reads all of them. Mixtral's stacked experts, read
    out of the file's per-expert tensors, are read the same way."""
    path = os.path.join(shared_dir(tmp_path), name)
    write_checkpoint(path, name, seed=4, max_shard_size="20KB")
    engine = st.shard(hf_builders()[name], config(stage))
    engine.load_pretrained(path)
    stats = _pretrained.last_load_stats
    numel = {n: p.numel() for n, p in type(engine.model).from_pretrained(path).named_parameters()}
    held = held_elements(engine)
    mine = sum(max(last - first, 0) for first, last in held.values())
    assert stats["bytes_read"] == 4 * mine and stats["elements"] == mine, stats
    total = world().allreduce(stats["bytes_read"])
    everything = 4 * sum(numel.values())
    assert total == (everything if stage == 3 else everything * st.world_size())
    if stage == 3 and st.world_size() > 1:
        assert stats["bytes_read"] < everything * 0.75  # about 1/world_size, not the model
    engine.close()


@pytest.mark.parametrize("name", ["gpt2", "mixtral"])
def test_nvme_offloaded_load_writes_each_shard_once(name, tmp_path):
    """Issue #36, decision 0043: loaded into an engine whose parameters and optimizer state are on NVMe, the model
    equals transformers' from_pretrained bit for bit, and the load writes each unit's fp32 master and parameter
    shard once. The bound: the bytes the engine's NVMe offload wrote during the load (nvme_bytes_written, its I/O
    queue's own count) are at most half of the rank's NVMe footprint. AdamW keeps three lanes (master, m, v) of
    the master's size, and the fp32 parameter shard of a unit whose master is one tile takes as much as its master
    lane (both rounded to the store's 4 KiB), so one pass, master + shards, is half of the footprint. Written
    range by range, a unit of k tensors was written about k times."""
    path = os.path.join(shared_dir(tmp_path), name)
    write_checkpoint(path, name, seed=12, max_shard_size="20KB")
    nvme = os.path.join(str(tmp_path), f"nvme{st.rank()}")
    os.makedirs(nvme)
    engine = st.shard(hf_builders()[name], config(3, zero_optimization={
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
        "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}))
    engine.load_pretrained(path)
    stats = _pretrained.last_load_stats
    footprint = engine.stats()["nvme_current_bytes"]
    assert 0 < stats["nvme_bytes_written"] <= footprint // 2, (stats, footprint)
    state = engine.full_state_dict()
    ref = type(engine.model).from_pretrained(path).state_dict()
    for k in ref:
        assert torch.equal(bits(state[k]), bits(ref[k])), k
    engine.close()


def test_other_ranks_bytes_are_never_read(tmp_path):
    """Each rank loads its own copy of a checkpoint in which every element it does not keep is NaN (a loader that
    read one would refuse it: weights must be finite): the model equals the unpoisoned one, bit for bit."""
    from safetensors.torch import save_file
    torch.manual_seed(10)
    ref = hf_builders()["gpt2"]().state_dict()
    engine = st.shard(hf_builders()["gpt2"], config(3))
    held = held_elements(engine)
    poisoned = {}
    for k, v in ref.items():
        v = v.clone().contiguous()
        if k in held:
            first, last = held[k]
            flat = v.view(-1)
            keep = flat[first:last].clone()
            flat.fill_(float("nan"))
            flat[first:last] = keep
        poisoned[k] = v
    poisoned.pop("lm_head.weight", None)  # tied to the embedding, as transformers writes it
    d = os.path.join(str(tmp_path), f"poison{st.rank()}")
    os.makedirs(d)
    save_file(poisoned, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    engine.load_pretrained(d)
    state = engine.full_state_dict()
    for k in ref:
        assert torch.equal(bits(state[k]), bits(ref[k])), k
    engine.close()


def test_both_io_backends_load_the_same(tmp_path, monkeypatch):
    """The offload reader's io_uring back-end (where the kernel allows it) and its pread thread pool give the same
    model, bit for bit; the statistics name the back-end used."""
    path = os.path.join(shared_dir(tmp_path), "gpt2")
    write_checkpoint(path, "gpt2", seed=11, max_shard_size="20KB")
    states = []
    for backend in ("threads", "auto"):
        monkeypatch.setenv("STRATA_IO_BACKEND", backend) if backend != "auto" else monkeypatch.delenv(
            "STRATA_IO_BACKEND", raising=False)
        engine = st.shard(hf_builders()["gpt2"], config(3))
        engine.load_pretrained(path)
        if backend == "threads":
            assert _pretrained.last_load_stats["backend"].startswith("threads"), _pretrained.last_load_stats
        states.append(engine.full_state_dict())
        engine.close()
    for k in states[0]:
        assert torch.equal(bits(states[0][k]), bits(states[1][k])), k


def test_a_parameter_of_another_dtype_is_refused(tmp_path):
    path = os.path.join(shared_dir(tmp_path), "f64")
    write_checkpoint(path, "gpt2", seed=12, dtype=torch.float64)
    engine = st.shard(hf_builders()["gpt2"], config(3))
    with pytest.raises(CheckpointError, match=r"f64/model\.safetensors': tensor '.*': is F64; a parameter is read "
                                              r"from F32, BF16, F16"):
        engine.load_pretrained(path)
    engine.close()


def test_a_file_cut_after_it_was_opened_is_a_named_error(tmp_path, monkeypatch):
    """The file shortened between the header checks and the reads: every rank fails, naming the file."""
    d = os.path.join(str(tmp_path), f"cut{st.rank()}")
    torch.manual_seed(13)
    state = hf_builders()["gpt2"]().state_dict()
    state.pop("lm_head.weight", None)  # tied to the embedding, as transformers writes it
    os.makedirs(d)
    target = os.path.join(d, "model.safetensors")
    # safetensors itself, not save_pretrained: under torch.distributed transformers spreads the files over the
    # ranks, and each rank here needs its own copy to cut
    save_file({k: v.contiguous() for k, v in state.items()}, target, metadata={"format": "pt"})
    engine = st.shard(hf_builders()["gpt2"], config(3))
    inner = _pretrained._load_held

    def cut_then_load(*args):
        os.truncate(target, 4096)
        return inner(*args)
    monkeypatch.setattr(_pretrained, "_load_held", cut_then_load)
    with pytest.raises(CheckpointError, match=r"cut\d/model\.safetensors"):
        engine.load_pretrained(d)
    engine.close()


def test_missing_extra_and_misshapen_tensors(tmp_path):
    base = shared_dir(tmp_path)
    path = os.path.join(base, "ok")
    write_checkpoint(path, "gpt2", seed=5)

    def variants():
        from safetensors.torch import load_file
        sd = load_file(os.path.join(path, "model.safetensors"))
        for what, change in (("missing", lambda d: d.pop("transformer.h.1.mlp.c_fc.bias")),
                             ("extra", lambda d: d.__setitem__("transformer.extra", torch.zeros(3))),
                             ("shape", lambda d: d.__setitem__("transformer.ln_f.bias", torch.zeros(5)))):
            d = dict(sd)
            change(d)
            os.makedirs(os.path.join(base, what))
            save_file(d, os.path.join(base, what, "model.safetensors"), metadata={"format": "pt"})
    on_rank_0(variants)
    engine = st.shard(hf_builders()["gpt2"], config(3))
    with pytest.raises(CheckpointError,
                       match=r"not this model's checkpoint: missing transformer\.h\.1\.mlp\.c_fc\.bias \(strict=False"):
        engine.load_pretrained(os.path.join(base, "missing"))
    before = engine.full_state_dict()["transformer.h.1.mlp.c_fc.bias"]
    result = engine.load_pretrained(os.path.join(base, "missing"), strict=False)
    assert result == {"missing_keys": ["transformer.h.1.mlp.c_fc.bias"], "unexpected_keys": []}
    assert torch.equal(engine.full_state_dict()["transformer.h.1.mlp.c_fc.bias"], before)  # left as it was
    with pytest.raises(CheckpointError, match=r"unexpected transformer\.extra"):
        engine.load_pretrained(os.path.join(base, "extra"))
    with pytest.raises(CheckpointError, match=r"shape/model.safetensors': tensor 'transformer\.ln_f\.bias': has "
                                              r"shape \[5\]; the model's 'transformer\.ln_f\.bias' is \[32\]"):
        engine.load_pretrained(os.path.join(base, "shape"))
    engine.close()


def test_bad_directories_and_indexes(tmp_path):
    base = shared_dir(tmp_path)
    sharded = os.path.join(base, "sharded")
    write_checkpoint(sharded, "gpt2", seed=6, max_shard_size="20KB")

    def copy(name, keep=lambda f: True, data=lambda f, raw: raw):
        """sharded's files into base/name: those `keep` accepts, their bytes through `data`."""
        d = os.path.join(base, name)
        os.makedirs(d)
        for f in os.listdir(sharded):
            if keep(f):
                with open(os.path.join(sharded, f), "rb") as src, open(os.path.join(d, f), "wb") as dst:
                    dst.write(data(f, src.read()))

    def index_with(edit):
        def data(f, raw):
            if f != "model.safetensors.index.json":
                return raw
            index = json.loads(raw)
            edit(index)
            return json.dumps(index).encode()
        return data

    def break_them():
        copy("escape", data=index_with(lambda i: i["weight_map"].__setitem__("lm", "../model.safetensors")))
        copy("gone", data=index_with(lambda i: i["weight_map"].__setitem__("transformer.wte.weight",
                                                                            "nope.safetensors")))
        copy("json", data=lambda f, raw: b'{"weight_map": {"a": "x", "a": "y"}}' if f.endswith("index.json") else raw)
        copy("nofile", keep=lambda f: "00002-of" not in f)
        copy("truncated", data=lambda f, raw: raw[:-4] if f.startswith("model-00001-of") else raw)
    on_rank_0(break_them)
    engine = st.shard(hf_builders()["gpt2"], config(3))
    for name, error in (
            ("absent", r"neither model\.safetensors nor model\.safetensors\.index\.json"),
            ("escape", r"tensor 'lm' names the file '\.\./model\.safetensors', which is not a plain file name"),
            ("gone", r"gone/model-\d{5}-of-\d{5}\.safetensors': tensor 'transformer\.wte\.weight': the index names "
                     r"'nope\.safetensors'"),
            ("nofile", r"nofile/model-00002-of-\d{5}\.safetensors': No such file"),
            ("json", r"not a readable JSON index \(duplicate index key 'weight_map\.a'\)"),
            ("truncated", r"truncated/model-00001-of-\d{5}\.safetensors': tensor '.*': data_offsets .* do not hold")):
        with pytest.raises(CheckpointError, match=error):
            engine.load_pretrained(os.path.join(base, name))
    engine.close()


def test_a_stacked_parameter_missing_a_piece_is_named(tmp_path):
    """Mixtral's file without one expert's w1: the stacked parameter it belongs to is not covered, an error naming
    the gap, on every rank, before anything is written."""
    from safetensors.torch import load_file
    path = os.path.join(shared_dir(tmp_path), "mixtral")
    write_checkpoint(path, "mixtral", seed=7)

    def drop():
        f = os.path.join(path, "model.safetensors")
        tensors = load_file(f)
        del tensors["model.layers.1.block_sparse_moe.experts.2.w1.weight"]
        save_file(tensors, f, metadata={"format": "pt"})
    on_rank_0(drop)
    engine = st.shard(hf_builders()["mixtral"], config(3))
    with pytest.raises(CheckpointError, match=r"experts.2.w3.weight': starts at element \d+ of the model's "
                                              r"'model.layers.1.mlp.experts.gate_up_proj', but the checkpoint's "
                                              r"tensors for it cover \[0, \d+\) before it"):
        engine.load_pretrained(path)
    engine.close()


@pytest.mark.parametrize("change", ["transposed", "flattened"])
def test_a_stacked_piece_of_another_shape_is_named(change, tmp_path):
    """Mixtral's file with one expert's w1 transposed (or flattened): as many elements, so its place in the stacked
    parameter and the tiling still add up, but it is not the tensor the conversion stacks (from_pretrained refuses
    it too). An error naming the tensor and both shapes, on every rank, not its values loaded in the wrong order."""
    from safetensors.torch import load_file
    path = os.path.join(shared_dir(tmp_path), "mixtral")
    write_checkpoint(path, "mixtral", seed=7)
    name = "model.layers.1.block_sparse_moe.experts.2.w1.weight"

    def reshape():
        f = os.path.join(path, "model.safetensors")
        tensors = load_file(f)
        w = tensors[name]
        tensors[name] = (w.t() if change == "transposed" else w.flatten()).contiguous()
        save_file(tensors, f, metadata={"format": "pt"})
    on_rank_0(reshape)
    engine = st.shard(hf_builders()["mixtral"], config(3))
    with pytest.raises(CheckpointError, match=rf"tensor '{name}': has shape \[\d+(, \d+)?\]; as a piece of the model's "
                                              r"'model.layers.1.mlp.experts.gate_up_proj' it is \[\d+, \d+\]"):
        engine.load_pretrained(path)
    engine.close()


def test_only_moves_of_whole_rows_are_read_as_pieces():
    """_stacked_pieces on row numbers (Note [Stacked parameters]): a split of a parameter's rows is read as pieces;
    a transpose, rows out of order, or rows of two parameters in one tensor are not (None: refused)."""
    shapes = {"a": (4, 3), "b": (2, 3)}
    wanted = {"a0": (2, 3), "a1": (2, 3)}

    def split(model, d):
        return {"a0": d["a"][:2], "a1": d["a"][2:], "b": d["b"]}
    assert _pretrained._stacked_pieces(None, shapes, wanted, split) == {"a0": ("a", 0), "a1": ("a", 6)}
    assert _pretrained._stacked_pieces(None, shapes, {"t": (3, 4)}, lambda m, d: {"t": d["a"].transpose(0, 1)}) \
        is None
    assert _pretrained._stacked_pieces(None, shapes, {"f": (4, 3)}, lambda m, d: {"f": d["a"].flip(0)}) is None
    assert _pretrained._stacked_pieces(None, shapes, {"c": (6, 3)}, lambda m, d: {"c": torch.cat([d["a"], d["b"]])}) \
        is None

    def fails(model, d):
        raise RuntimeError("an operation on values")
    assert _pretrained._stacked_pieces(None, shapes, wanted, fails) is None


def test_a_plain_torch_model_round_trips_through_its_own_export(tmp_path):
    """engine.save_pretrained of one engine, load_pretrained into another created from another seed: the same."""
    path = os.path.join(shared_dir(tmp_path), "tiny")
    torch.manual_seed(8)
    a = st.shard(TinyLM, config(3))
    a.save_pretrained(path, max_shard_size="2KB")
    torch.manual_seed(9)
    b = st.shard(TinyLM, config(2))
    b.load_pretrained(path)
    sa, sb = a.full_state_dict(), b.full_state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert sb["head.weight"] is sb["emb.weight"]
    a.close()
    b.close()


# ---- fuzz: a header corrupted at random is a valid file or a CheckpointError naming the file ----
def _mutations(data, rng):
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    kind = rng.randrange(6)
    if kind == 0:  # bytes of the header replaced
        b = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            b[rng.randrange(8, 8 + n)] = rng.randrange(256)
        return bytes(b)
    if kind == 1:  # truncated anywhere
        return data[:rng.randrange(len(data))]
    if kind == 2:  # the header length field
        return struct.pack("<Q", rng.choice([0, 1, n - 1, n + 1, len(data), 2 ** 63, rng.randrange(2 ** 64)])) + \
            data[8:]
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    e = header[name]
    if kind == 3:
        e["data_offsets"] = [rng.choice([-1, 0, e["data_offsets"][0], 10 ** 12]),
                             rng.choice([e["data_offsets"][1] + 4, e["data_offsets"][0], 2 ** 70, "x"])]
    elif kind == 4:
        e["shape"] = rng.choice([[], [-1], [2 ** 40, 2 ** 40], ["a"], list(e["shape"]) + [2], [1] * 70, None])
    else:
        e["dtype"] = rng.choice(["F8", "", 3, "f32", "BF16", "I64", None])
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + n:]


def test_fuzzed_headers_are_valid_or_named_errors(tmp_path):
    """400 corruptions of a checkpoint file (header bytes, truncation, the length field, offsets, shapes,
    dtypes), on each rank its own: open_checkpoint either accepts a file whose tensors tile its data, or raises
    CheckpointError naming the file. No other exception, no crash."""
    d = os.path.join(str(tmp_path), f"fuzz{st.rank()}")
    os.makedirs(d)
    path = os.path.join(d, "model.safetensors")
    save_file({"a": torch.randn(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16), "c": torch.arange(6)}, path,
              metadata={"format": "pt"})
    with open(path, "rb") as f:
        good = f.read()
    rng = random.Random(1234)
    errors = accepted = 0
    for _ in range(400):
        with open(path, "wb") as f:
            f.write(_mutations(good, rng))
        try:
            entries, files = _pretrained.open_checkpoint(d)
        except CheckpointError as e:
            assert path in str(e), e
            errors += 1
            continue
        for f in files:
            covered = sorted((e.begin, e.end) for e in entries.values())
            assert covered[0][0] == 0 and covered[-1][1] == f.data_len
            assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
            f.close()
        accepted += 1
    assert errors > 300 and accepted > 0  # most corruptions are refused; harmless ones (dtype BF16 <-> ...) are not
