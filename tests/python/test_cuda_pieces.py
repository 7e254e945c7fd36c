"""strata.torch on CUDA, the parts a host can run (docs/decisions/0020): the engine's device from the model
and the launcher's local rank, the __cuda_array_interface__ of the engine's device buffers, the dtype
mapping, and the launch decision. The CUDA views themselves (torch.as_tensor over a device pointer) need a
GPU: scripts/gpu_check's strata.torch row (never run yet)."""
import os

import pytest
import torch

import strata.torch as st
from strata import _capi
from strata._comm import mpi_launch, torchrun_launch
from strata.torch._buffers import _CUDA_TYPESTR, _TORCH_DTYPE, cuda_array_interface
from strata.torch._device import choose_device, local_rank

from common import world

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_device_follows_the_parameters_or_the_request():
    assert choose_device([CPU, CPU], None, {}, 0) == CPU
    assert choose_device([CPU], "cpu", {"LOCAL_RANK": "1"}, 2) == CPU
    assert choose_device([CPU], "host", {}, 2) == CPU
    assert choose_device([CPU], "cuda", {}, 2) == torch.device("cuda", 0)
    assert choose_device([torch.device("cuda", 1)] * 2, None, {}, 2) == torch.device("cuda", 1)  # the params' GPU
    assert choose_device([CPU], "cuda:1", {"LOCAL_RANK": "0"}, 2) == torch.device("cuda", 1)  # explicit wins
    assert choose_device([CPU], torch.device("cuda", 0), {"LOCAL_RANK": "1"}, 2) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="several kinds of device"):
        choose_device([CPU, torch.device("cuda", 0)], None, {}, 1)
    with pytest.raises(ValueError, match="device 'meta' is not supported"):
        choose_device([CPU], "meta", {}, 1)


def test_the_gpu_is_the_local_ranks():
    torchrun = {"LOCAL_RANK": "3", "RANK": "7", "SLURM_LOCALID": "0"}
    assert choose_device([CPU], "cuda", torchrun, 8, torchrun=True) == torch.device("cuda", 3)
    assert choose_device([CPU], "cuda", torchrun, 2, torchrun=True) == torch.device("cuda", 1)  # modulo the GPUs
    assert choose_device([CPU], "cuda", torchrun, 0, torchrun=True) == torch.device("cuda", 3)  # none: reported later
    # under torchrun an inherited Slurm local rank is not the worker's; under mpirun MPI's comes first
    assert local_rank(torchrun, torchrun=True) == 3
    assert local_rank(torchrun, torchrun=False) == 0
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "LOCAL_RANK": "5"}, torchrun=False) == 2
    assert local_rank({}, torchrun=False) == 0
    with pytest.raises(ValueError, match="LOCAL_RANK='x' is not an integer"):
        local_rank({"LOCAL_RANK": "x"}, torchrun=True)
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_LOCAL_RANK=-1 is negative"):
        local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "-1"}, torchrun=False)


def test_cuda_array_interface_of_an_engine_buffer():
    i = cuda_array_interface(0x7f0000001000, 12, _capi.DTYPE_F32)
    assert i == {"shape": (12,), "typestr": "<f4", "data": (0x7f0000001000, False), "strides": None, "version": 3,
                 "stream": None}  # writable (gradients), contiguous, and the gather already completed
    assert cuda_array_interface(16, 3, _capi.DTYPE_BF16)["typestr"] == "<i2"  # bits, reinterpreted as bf16
    assert cuda_array_interface(16, 3, _capi.DTYPE_F16)["typestr"] == "<f2"
    with pytest.raises(ValueError, match="NULL device pointer"):
        cuda_array_interface(0, 3, _capi.DTYPE_F32)


def test_dtype_mapping_keeps_the_element_size_and_the_bits():
    import numpy as np
    for strata_dtype, (torch_dtype, ctype) in _TORCH_DTYPE.items():
        typestr, reinterpret = _CUDA_TYPESTR[strata_dtype]
        size = torch.empty((), dtype=torch_dtype).element_size()
        assert np.dtype(typestr).itemsize == size
        # what torch.as_tensor builds from the typestr, then .view(dtype) as flat_view does: the same bits
        values = torch.tensor([1.5, -2.25, 3e-3], dtype=torch_dtype)
        raw = torch.from_numpy(values.view(torch.int16 if size == 2 else torch.int32).numpy().view(typestr))
        back = raw.view(reinterpret) if reinterpret is not None else raw
        assert back.dtype == torch_dtype and torch.equal(back, values)


def test_launch_decision():
    t = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert torchrun_launch(t, 1) == (1, 2, 1)
    assert torchrun_launch(dict(t, LOCAL_RANK="0"), 1) == (1, 2, 0)
    assert torchrun_launch({"WORLD_SIZE": "2", "RANK": "1"}, 1) == (1, 2, 1)  # LOCAL_RANK defaults to RANK
    assert torchrun_launch(t, 2) is None                                     # MPI's world has the ranks
    assert torchrun_launch(dict(t, OMPI_COMM_WORLD_SIZE="2"), 1) is None
    assert torchrun_launch({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, 1) is None  # shell leftovers


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: scripts/gpu_check covers it")
def test_a_cuda_model_without_a_gpu_fails_on_every_rank_naming_it():
    """Under mpirun: the engine would bootstrap NCCL over MPI's world; here torch sees no GPU, and every rank says
    so before any engine exists. Under torchrun, where a CUDA engine's ranks are torchrun's NCCL world, this
    process's earlier tests' host engines already took the gloo world: that is refused by name (a fresh torchrun
    job's CUDA model: test_launch.py's probe)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    expected = (r"rank \d+: the engine is on cuda:\d+, but torch sees no CUDA GPU" if mpi_launch(os.environ) else
                r"already run on the gloo world; a host and a CUDA model cannot both be sharded over torch.distributed")
    with pytest.raises(RuntimeError, match=expected):
        st.shard(model, device="cuda")
    world().Barrier()
