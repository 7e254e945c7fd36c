"""Every rank of `mpirun -n N python -m pytest tests/python` runs the same tests in the same order; each
test is collective. One thread per rank: the machine's cores are shared by the ranks."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)
