"""The cost of strata.broadcast_buffers (docs/decisions/0026-buffers.md): one sync (rank 0's buffers packed
into one uint8 tensor, one broadcast, unpacked) per training forward and per step().

    scripts/mpirun_local -n 2 build/venv/bin/python benchmarks/peers/buffers_bench.py

Measured: HF GPT-2 124M as transformers builds it (its buffers, if any), and two buffer sets of models that
have them: ResNet-50's BatchNorms (53 layers, 26,560 channels: running mean and var in fp32 and an int64
counter each, 213 KB) and the causal masks older transformers registered in every GPT-2 block (12 x
1024 x 1024 bool, 12 MiB; DDP broadcasts those too). The median and the fastest of 50 syncs (on a shared
machine the fastest is the cost, the median includes waiting for a core), the slowest rank's, in ms.
"""
import statistics
import time

import torch
from torch import nn

import strata.torch as st
from strata.torch._model_buffers import ModelBuffers

REPEATS = 50

RESNET50_BN = [64] + [64, 64, 256, 256] + [64, 64, 256] * 2 + [128, 128, 512, 512] + [128, 128, 512] * 3 + \
    [256, 256, 1024, 1024] + [256, 256, 1024] * 5 + [512, 512, 2048, 2048] + [512, 512, 2048] * 2


class Masks(nn.Module):
    def __init__(self, layers=12, n=1024):
        super().__init__()
        self.h = nn.ModuleList(nn.Module() for _ in range(layers))
        for m in self.h:
            m.register_buffer("bias", torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config())


def time_sync(model):
    buffers = ModelBuffers(model, torch.float32, True)
    nbytes = sum(m._buffers[k].numel() * m._buffers[k].element_size() for m, k, _ in buffers.slots)
    times = []
    for _ in range(REPEATS):
        st.world().barrier()
        t = time.perf_counter()
        buffers.before_training_forward()
        times.append(time.perf_counter() - t)
    return len(buffers.slots), nbytes, 1e3 * statistics.median(times), 1e3 * min(times)


def main():
    torch.set_num_threads(1)
    models = {"HF GPT-2 124M": gpt2, "ResNet-50 BatchNorms": lambda: nn.Sequential(*map(nn.BatchNorm2d, RESNET50_BN)),
              "GPT-2 causal masks (older transformers)": Masks}
    for name, make in models.items():
        n, nbytes, median, fastest = time_sync(make())
        median, fastest = max(st.world().allgather(median)), max(st.world().allgather(fastest))
        if st.rank() == 0:
            print(f"{name}: {n} buffers, {nbytes} bytes: one sync {median:.3f} ms median, {fastest:.3f} ms fastest "
                  f"(the slowest rank's) at {st.world_size()} ranks")


if __name__ == "__main__":
    main()
