"""Four Gloo ranks train a torch.compile-d DDP module while its process group changes.

The group shrinks to ranks 0 and 1, switches to ranks 2 and 3, and grows back to
all four, through DistributedDataParallel._update_process_group and without
wrapping the module again. After every step each member checks its gradients
against the average over the current group's members computed locally, and the
demo prints how many graphs torch.compile has compiled.

Then, on torch 2.14 or later, rank 3 is killed in its backward pass. The others
recover as docs/recovery.md's recipe does, with the elastic example's code: they
release the failed group at once, reconfigure the default group in place to the
three of them (init_process_group(..., enable_reconfigure=True),
torch.distributed._reconfigure), and follow it with _update_process_group. The
demo prints the time from the kill until the last survivor is back on the group,
and the graphs compiled after it: none. On an older torch, which cannot
reconfigure a group in place, it says so and skips that part.

Run it with scripts/demo, which sets up the overlay venv first.
"""

import argparse
import copy
import datetime
import os
import signal
import sys
import tempfile
import time

import torch
import torch._dynamo.testing
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

# The recovery's release and reconfigure: the elastic example's, which docs/recovery.md's
# recipe does too. This file's folder is the first on sys.path when it runs.
from elastic_ddp import reconfigure, release_failed_group
from torch.nn.parallel import DistributedDataParallel

WORLD_SIZE = 4
# Whether this torch can reconfigure a process group in place (2.14 or later).
IN_PLACE = hasattr(dist, "_reconfigure")
IN_PLACE_SKIPPED = (
    f"torch {torch.__version__} cannot reconfigure a process group in place "
    "(torch.distributed._reconfigure, torch 2.14 or later): scripts/demo --base v2.14.1 runs it"
)
# The rank killed in its backward pass, and the ones that go on.
VICTIM = 3
SURVIVORS = [r for r in range(WORLD_SIZE) if r != VICTIM]
# The default group's collective timeout, which the survivors do not wait for: each releases
# the failed group at once, and the next one's collective fails then. Long enough for a rank
# to wait out another one's first compile.
TIMEOUT_S = 120.0


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


def train(ddp, module, model, rank, members, step, steps):
    """Trains ``steps`` steps from ``step`` on ``members``; returns in how many the gradients
    equal the members' average on every member."""
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
    return checked


def recover(store, ddp, module, model, counter, rank, step, steps):
    """Rank VICTIM is killed in its backward pass; the others recover in place and train on."""
    # Back on the default group, the one that can be reconfigured in place; every rank holds
    # the same parameters since the expand phase.
    ddp._update_process_group(dist.group.WORLD)
    if rank == VICTIM:

        def die(grad):
            store.set("killed_at_ns", str(time.monotonic_ns()))
            os.kill(os.getpid(), signal.SIGKILL)

        # fc1's gradient comes last, once the others are ready for the allreduce.
        module.fc1.weight.register_hook(die)
    failed = False
    try:
        ddp.zero_grad(set_to_none=True)
        loss_fn(model(batch(rank, step))).backward()
    except RuntimeError:
        # Nothing of the exception kept: its traceback holds the failed Work.
        failed = True
    if not failed:
        print(f"rank {rank}: the backward pass did not fail", flush=True)
        sys.exit(1)
    # Out of the except clause: close the failed group's connections at once, so that a
    # survivor still waiting in the same allreduce fails too, then reconfigure the group in
    # place to the survivors (uuid 0 made it the four ranks), and follow it.
    release_failed_group(ddp, rank, generation=1, in_place=True)
    reconfigure(store, rank, SURVIVORS, uuid=1, timeout_s=TIMEOUT_S)
    ddp._update_process_group(dist.group.WORLD)
    since_kill = time.monotonic_ns() - int(store.get("killed_at_ns"))
    slowest = torch.tensor([since_kill], dtype=torch.int64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    graphs = counter.frame_count
    # The failed step again, on the survivors.
    checked = train(ddp, module, model, rank, SURVIVORS, step, steps)
    if rank == SURVIVORS[0]:
        print(
            f"recover: rank {VICTIM} killed in its backward pass; members {SURVIVORS}, world size "
            f"{dist.get_world_size(ddp.process_group)}, gradients equal the members' average in "
            f"{checked}/{steps} steps, compiled graphs {counter.frame_count} (new since the "
            f"recovery: {counter.frame_count - graphs})\n"
            f"recovery time: {slowest.item() / 1e9:.2f} s from the kill until the last survivor was "
            "back on the group reconfigured in place",
            flush=True,
        )
    if counter.frame_count != graphs or checked != steps:
        sys.exit(1)


def worker(rank, store_path, backend, steps):
    store = dist.FileStore(store_path, WORLD_SIZE)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=WORLD_SIZE,
        **(
            dict(timeout=datetime.timedelta(seconds=TIMEOUT_S), enable_reconfigure=True)
            if IN_PLACE
            else {}
        ),
    )
    if IN_PLACE:
        reconfigure(store, rank, list(range(WORLD_SIZE)), uuid=0, timeout_s=TIMEOUT_S)
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
        checked = train(ddp, module, model, rank, members, step, steps)
        step += steps
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
    if IN_PLACE:
        recover(store, ddp, module, model, counter, rank, step, steps)
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
        ranks = mp.start_processes(
            worker,
            args=(os.path.join(tmp, "store"), args.backend, args.steps),
            nprocs=WORLD_SIZE,
            join=False,
            start_method="spawn",
        )
        # Killed in the recovery part, and only there.
        expected = [
            -signal.SIGKILL if IN_PLACE and rank == VICTIM else 0
            for rank in range(WORLD_SIZE)
        ]
        failed = wait_for_ranks(ranks.processes, expected)
    if failed:
        print(f"demo failed: {failed}", file=sys.stderr)
        return 1
    if not IN_PLACE:
        print(f"recover: skipped: {IN_PLACE_SKIPPED}")
    print(
        "ok: the group changed three times with no recompilation and correct gradients"
        + (
            ", and the survivors of a rank killed in its backward pass went on in place, "
            "with none either"
            if IN_PLACE
            else ""
        )
    )
    return 0


def wait_for_ranks(processes, expected):
    """Waits for the ranks; once one exits otherwise than ``expected`` says, ends the others.
    Returns what went wrong, or ""."""
    while True:
        codes = [p.exitcode for p in processes]
        wrong = [
            f"rank {rank} exited with {code}, not {want}"
            for rank, (code, want) in enumerate(zip(codes, expected))
            if code is not None and code != want
        ]
        if wrong or None not in codes:
            for p in processes:
                if p.exitcode is None:
                    p.terminate()
                p.join()
            return "; ".join(wrong)
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
