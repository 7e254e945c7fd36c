"""strata.torch on one dimension of a torch DeviceMesh, the script's own code on the other (docs/decisions/0039,
"A mesh"). The job trains an ensemble: the mesh is (member, dp). Each member is a model of its own, seeded by its
index; its ranks along "dp" are data parallel, and Strata shards the member's model over them
(st.shard(..., device_mesh=mesh["dp"])). The script's own code uses "member": every few steps it all-reduces the
members' losses over that dimension and prints the ensemble's mean.

  torchrun --standalone --nproc-per-node 4 examples/torch/mesh_ensemble.py --members 2 --steps 30

--out DIR saves each member's final weights and losses (rank 0 of its dp group) to DIR/member<m>.pt. The rows of a
member's data depend only on its index and its dp rank, so a member trains here exactly as it would alone on its
dp ranks (tests/python/test_launch.py checks it bit for bit)."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import strata.torch as st


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--members", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    dist.init_process_group("gloo")  # torchrun's environment
    if dist.get_world_size() % args.members:
        raise SystemExit(f"{dist.get_world_size()} ranks do not split into {args.members} members")
    mesh = init_device_mesh("cpu", (args.members, dist.get_world_size() // args.members),
                            mesh_dim_names=("member", "dp"))
    member, dp_rank = mesh.get_local_rank("member"), mesh.get_local_rank("dp")

    torch.manual_seed(member)  # each member its own initial weights (rank 0 of its dp group's are the ones used)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                torch.nn.GELU(), torch.nn.Linear(256, 1))
    config = {"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
              "strata": {"optimizer_threads": 1}}
    engine = st.shard(model, config=config, unit_classes=[torch.nn.Linear], device_mesh=mesh["dp"])

    target = torch.nn.Linear(32, 1)  # the function to learn, the same for every member
    with torch.no_grad():
        target.weight.copy_(torch.linspace(-1, 1, 32) / 4)
        target.bias.fill_(0.5)
    losses = []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(10_000 * member + 100 * step + dp_rank)
        x = torch.randn(64, 32, generator=g)
        with torch.no_grad():
            y = torch.tanh(target(x))
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        engine.step()
        mean = st.all_reduce_mean(loss.item())  # over this member's dp ranks (Strata's group)
        losses.append(mean)
        if step % args.print_every == 0 or step == args.steps - 1:
            # The script's own collective, over the other dimension: the members' losses.
            every = torch.tensor([mean], dtype=torch.float64)
            dist.all_reduce(every, group=mesh["member"].get_group())
            if dist.get_rank() == 0:
                print(f"step {step:3d}  member 0 loss {mean:.5f}  ensemble mean loss "
                      f"{every.item() / args.members:.5f}", flush=True)
    state = engine.full_state_dict()
    if args.out and dp_rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"state": state, "losses": losses}, os.path.join(args.out, f"member{member}.pt"))
    if dist.get_rank() == 0:
        print(f"final member 0 loss {losses[-1]:.5f} (first {losses[0]:.5f})", flush=True)


if __name__ == "__main__":
    main()
