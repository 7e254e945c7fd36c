"""Where an engine runs: the host, or the GPU of this rank (docs/decisions/0020; unverified on a GPU).

The choice is pure (choose_device) so that it is tested on a host: a model whose parameters are on CUDA,
or shard(..., device="cuda"), runs on CUDA; on the GPU of an explicit index ("cuda:1", or the parameters'
own device), else of the launcher's local rank (torchrun's LOCAL_RANK, mpirun's OMPI_COMM_WORLD_LOCAL_RANK,
...) modulo the GPUs visible, as `strata train` picks its GPU.
"""
import torch

# The MPI launchers' local-rank variables, in the order `strata train` reads them (env::LauncherLocalRank);
# under torchrun its LOCAL_RANK alone (a Slurm local rank the workers inherit from an allocation is not theirs).
MPI_LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK")


def local_rank(env, torchrun):
    for name in ("LOCAL_RANK",) if torchrun else MPI_LOCAL_RANK_VARIABLES:
        value = env.get(name)
        if value is None:
            continue
        try:
            r = int(value)
        except ValueError:
            raise ValueError(f"strata: {name}='{value}' is not an integer (the launcher's local rank)") from None
        if r < 0:
            raise ValueError(f"strata: {name}={r} is negative (the launcher's local rank)")
        return r
    return 0


def choose_device(param_devices, requested, env, cuda_count, torchrun=False):
    """torch.device("cpu") or torch.device("cuda", k) for an engine. `param_devices`: the devices of the
    model's parameters; `requested`: shard()'s `device` (None, a string or a torch.device); `env`: the
    environment (the local rank; `torchrun`: a torchrun launch); `cuda_count`: the GPUs torch sees (0 here means the index is the local
    rank, and the missing GPU is reported by whoever needs it first)."""
    kinds = sorted({torch.device(d).type for d in param_devices})
    if requested is None:
        if len(kinds) > 1:
            raise ValueError(f"strata: the model's parameters are on several kinds of device ({', '.join(kinds)}); "
                             f"move them to one, or pass shard(..., device=...)")
        wanted = torch.device(param_devices[0]) if param_devices else torch.device("cpu")
    else:
        wanted = torch.device("cpu" if requested == "host" else requested)
    if wanted.type == "cpu":
        return torch.device("cpu")
    if wanted.type != "cuda":
        raise ValueError(f"strata: device '{wanted}' is not supported: use 'cuda' or 'cpu'")
    if wanted.index is not None:
        return wanted
    indexed = {torch.device(d).index for d in param_devices if torch.device(d).type == "cuda"} - {None}
    if len(indexed) == 1 and requested is None:
        return torch.device("cuda", indexed.pop())
    r = local_rank(env, torchrun)
    return torch.device("cuda", r % cuda_count if cuda_count > 0 else r)
