"""Four Gloo ranks train a torch.compile-d DDP module while its process group changes.

The group shrinks to ranks 0 and 1, switches to ranks 2 and 3, and grows back to
all four, through DistributedDataParallel._update_process_group and without
wrapping the module again. After every step each member checks its gradients
against the average over the current group's members computed locally, and the
demo prints how many graphs torch.compile has compiled.

Run it with scripts/demo, which sets up the overlay venv first.
"""

import argparse
import copy
import os
import sys
import tempfile

import torch
import torch._dynamo.testing
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

WORLD_SIZE = 4


def batch(owner, step):
    gen = torch.Generator().manual_seed(1000 * step + owner)
    return torch.randn(16, 32, generator=gen)


def loss_fn(out):
    return out.pow(2).mean()


def expected_grads(module, members, step):
    """The average over ``members`` of the gradients a plain copy gets on their batches."""
    reference = copy.deepcopy(module)
    total = [torch.zeros_like(p) for p in reference.parameters()]
    for member in members:
        reference.zero_grad(set_to_none=True)
        loss_fn(reference(batch(member, step))).backward()
        for acc, p in zip(total, reference.parameters()):
            acc += p.grad
    return [acc / len(members) for acc in total]


class Model(nn.Module):
    # Not an nn.Sequential: Dynamo compiles nothing of one inside DDP since torch 2.11
    # (it breaks the graph at Sequential's generator), and the demo would count nothing.
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 8)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def worker(rank, store_path, backend, steps):
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, WORLD_SIZE),
        rank=rank,
        world_size=WORLD_SIZE,
    )
    torch.manual_seed(0)
    module = Model()
    ddp = DistributedDataParallel(module)
    # Counts the frames that Dynamo compiles, and compiles them with ``backend``.
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    model = torch.compile(ddp, backend=counter)
    everyone = list(range(WORLD_SIZE))
    phases = [
        ("start", everyone, None),
        ("shrink", [0, 1], dist.new_group([0, 1])),
        ("switch", [2, 3], dist.new_group([2, 3])),
        ("expand", everyone, dist.new_group(everyone)),
    ]
    step = 0
    warm = None
    for phase, members, group in phases:
        if group is not None:
            # Ranks 2 and 3 trained apart from 0 and 1, so on expanding everyone gets
            # the weights of the new group's rank 0.
            ddp._update_process_group(group, sync_module_states=phase == "expand")
        if rank not in members:
            continue
        checked = 0
        for _ in range(steps):
            want = expected_grads(module, members, step)
            ddp.zero_grad(set_to_none=True)
            loss_fn(model(batch(rank, step))).backward()
            ok = all(
                torch.allclose(p.grad, w, atol=1e-6)
                for p, w in zip(module.parameters(), want)
            )
            flag = torch.tensor([int(ok)])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=ddp.process_group)
            checked += int(flag.item())
            with torch.no_grad():
                for p in module.parameters():
                    p -= 0.05 * p.grad
            step += 1
        if warm is None:
            warm = counter.frame_count
            if warm == 0:
                print(
                    "torch.compile compiled nothing: no recompilation would mean nothing",
                    flush=True,
                )
                sys.exit(1)
        if rank == members[0]:
            print(
                f"{phase:>7}: members {members}, world size {dist.get_world_size(ddp.process_group)}, "
                f"gradients equal the members' average in {checked}/{steps} steps, "
                f"compiled graphs {counter.frame_count} (new since the first step: {counter.frame_count - warm})",
                flush=True,
            )
        if counter.frame_count != warm or checked != steps:
            sys.exit(1)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backend",
        default="inductor",
        help="torch.compile backend (default: inductor)",
    )
    parser.add_argument(
        "--steps", type=int, default=3, help="steps per phase (default: 3)"
    )
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {WORLD_SIZE} Gloo ranks, torch.compile backend {args.backend!r}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(
                worker,
                args=(os.path.join(tmp, "store"), args.backend, args.steps),
                nprocs=WORLD_SIZE,
            )
        except mp.ProcessExitedException as e:
            print(f"demo failed: {e}", file=sys.stderr)
            return 1
    print(
        "ok: the group changed three times with no recompilation and correct gradients"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
