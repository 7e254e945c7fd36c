"""How strata's own lines on stderr name their process: "strata", and in a job of more than one rank the rank its
launcher gave it ("strata r3"), as the library's log lines say it ("[strata r3 W]")."""
import os

# (rank, world size) variables of the launchers strata runs under, MPI's first: an MPI launch wins over the
# torchrun variables a shell may still hold (strata._comm.torchrun_launch).
_LAUNCH_VARIABLES = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                     ("RANK", "WORLD_SIZE"))


def who(env=None):
    """'strata r<rank>' in a launch of more than one rank, else 'strata'. Reads only the environment, so it is safe
    in an exit handler and before any world is bound."""
    env = os.environ if env is None else env
    for rank, size in _LAUNCH_VARIABLES:
        if rank in env and size in env:
            try:
                return f"strata r{int(env[rank])}" if int(env[size]) > 1 else "strata"
            except ValueError:
                return "strata"
    return "strata"
