"""Run by test_foreign_conformance.py under `torchrun --standalone --nproc-per-node N`: the Communicator
conformance suite (tests/runtime/comm/comm_conformance.h, in libstrata_conformance.so, argv[1]) over a foreign
communicator whose callbacks are strata._torch_comm's, on torch.distributed's gloo. Exits with the suite's status
without tearing down (os._exit): the notice case leaves gloo calls that Strata abandoned, which end only at their
timeout or when the peers' processes exit."""
import ctypes
import os
import sys

import torch.distributed as dist

from strata import _capi, _torch_comm

module = ctypes.CDLL(sys.argv[1])
module.strata_test_conformance.argtypes = [ctypes.POINTER(_capi.ForeignComm), ctypes.c_int64, ctypes.c_char_p]
module.strata_test_conformance.restype = ctypes.c_int
dist.init_process_group("gloo")
store = dist.distributed_c10d._get_default_store()
own = _torch_comm.Endpoint(dist.group.WORLD, store, owned=False).dup(20000)
rc = module.strata_test_conformance(ctypes.byref(_torch_comm.make(own)), 20000,
                                    (sys.argv[2] if len(sys.argv) > 2 else "*").encode())
print(f"rank {dist.get_rank()}: conformance exit {rc}", flush=True)
sys.stderr.flush()
os._exit(rc)
