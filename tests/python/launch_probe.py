"""Run by test_launch.py under torchrun: must fail at `import strata.torch`."""
import strata.torch  # noqa: F401

print("imported", flush=True)
