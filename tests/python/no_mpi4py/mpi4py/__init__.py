"""Put first on PYTHONPATH by test_launch.py for its torchrun jobs: any import of mpi4py fails, so a job that
passes needed neither mpi4py nor MPI's Python side."""
raise ImportError("mpi4py is blocked in this job (tests/python/no_mpi4py): strata.torch must not need it here")
