"""Every rank of `mpirun -n N python -m pytest tests/python` runs the same tests in the same order; each
test is collective. One thread per rank: the machine's cores are shared by the ranks."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)


@pytest.fixture
def host_group():
    """The gloo group of a torchrun run's ranks (strata._comm's world); skips under mpirun, where the engines run on
    MPI."""
    from strata import _comm
    w = _comm.bind()
    if w.kind != "torch":
        pytest.skip("the engines run on MPI here (the torchrun runs of the suite test this)")
    return w.host_group
