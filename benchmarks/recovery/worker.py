"""What every worker process has: its arguments, its event log, the driver's store, the model.

Each worker module (worker_replica, worker_torchft, worker_steady, worker_call) ends with
``sys.exit(worker.run(its_main))``: the arguments below, which the driver passes, and the
exception that ends the process, recorded for the driver.
"""

import argparse
import datetime
import hashlib
import os
import signal
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from benchmarks.recovery.events import error_path, Events
from benchmarks.resume_after_membership_change import (
    LanguageModel,
    SEQUENCE,
    SIZES,
    VOCAB,
)

BATCH = 4


def batch(step: int, slot: int):
    """Returns the tokens of ``slot`` at ``step``: a new process in a lost one's slot trains on its data."""
    gen = torch.Generator().manual_seed(1000 * step + slot)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Hashes the parameters and Adam's state, bit for bit."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
        for value in optimizer.state.get(p, {}).values():
            h.update(
                value.numpy().tobytes()
                if isinstance(value, torch.Tensor)
                else repr(value).encode()
            )
    return h.hexdigest()[:16]


class Process:
    """What every process of the benchmark has: its event log, the driver's store, and the
    model (seeded alike in every process), Adam and the loss."""

    def __init__(self, args):
        self.args, self.slot = args, args.slot
        self.events = Events(args.events, args.slot)
        self.store = dist.TCPStore(
            args.host,
            args.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=args.timeout),
        )
        # The user's OMP_NUM_THREADS wins; else the cores shared among the processes.
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
        torch.manual_seed(0)
        self.model = LanguageModel(SIZES[args.size])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()

    def compiled(self, ddp: nn.Module) -> nn.Module:
        return torch.compile(ddp) if self.args.compile == "inductor" else ddp

    def die_if_due(self, step: int) -> None:
        """Dies where ``step`` is the kill's and the kill comes between steps: before the
        process starts the step, after it completed the one before on every replica.
        """
        if self.args.kill_step == step and self.args.kill_in == "between_steps":
            self.die(step)

    def backward(self, net: nn.Module, step: int) -> None:
        """Runs the forward and backward pass of ``step``; where it is the kill's, and the kill
        comes in the backward pass, the process dies in it."""
        if self.args.kill_step == step and self.args.kill_in == "backward":
            # The embedding's gradient comes last, after the other buckets' allreduces started.
            self.model.embed.weight.register_hook(lambda grad: self.die(step))
        inputs, targets = batch(step, self.slot)
        self.loss_fn(net(inputs).flatten(0, 1), targets.flatten()).backward()

    def train_step(self, net: nn.Module, step: int) -> None:
        self.backward(net, step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def init_whole_group(self, prefix: str) -> None:
        """Initializes the default group of every process the driver started, ranked by slot."""
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(prefix, self.store),
            rank=self.slot,
            world_size=self.args.world,
        )

    def die(self, step: int) -> None:
        self.events.log("kill", step=step)
        os.kill(os.getpid(), signal.SIGKILL)

    def finish(self, step: int, graphs_after_warmup: int) -> None:
        """Logs the state at the end, and saves the parameters, for the comparison with the reference."""
        self.events.log(
            "final",
            step=step,
            digest=state_digest(self.model, self.optimizer),
            graphs_after_warmup=graphs_after_warmup,
        )
        parameters = [p.detach() for p in self.model.parameters()]
        torch.save(parameters, os.path.join(self.args.events, f"final-{self.slot}.pt"))


def parse_arguments() -> argparse.Namespace:
    """Parses what the driver passes to a worker."""
    parser = argparse.ArgumentParser(
        description="A worker process of the recovery benchmark; the driver "
        "(python -m benchmarks.recovery) starts it with these arguments."
    )
    for name in ("--slot", "--world", "--port"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--size", required=True, choices=sorted(SIZES))
    parser.add_argument("--events", required=True, help="the run's event directory")
    parser.add_argument("--host", default="localhost", help="the driver's store")
    parser.add_argument("--timeout", type=float, default=120.0, help="of the store")
    parser.add_argument("--compile", default="none", choices=["none", "inductor"])
    parser.add_argument("--path", help="the recovery path (worker_replica)")
    parser.add_argument("--steps", type=int, help="steps to run, at most")
    parser.add_argument("--warmup", type=int, help="steps before the timed ones")
    parser.add_argument("--repeats", type=int, help="of each timing (worker_call)")
    parser.add_argument("--kill-step", type=int, help="the step this process dies at")
    parser.add_argument("--kill-in", help="where in that step")
    parser.add_argument("--first-generation", type=int)
    parser.add_argument("--checkpoint", help="path restart's checkpoint file")
    parser.add_argument("--collective-timeout", type=float, default=10.0)
    parser.add_argument("--lighthouse", help="torchft's lighthouse address")
    parser.add_argument(
        "--restarted",
        action="store_true",
        help="a process of a restart (path restart), or torchft's new process",
    )
    return parser.parse_args()


def run(main: Callable[[argparse.Namespace], int]) -> int:
    """Runs a worker's ``main`` on the driver's arguments; records the exception that ends it."""
    args = parse_arguments()
    try:
        return main(args)
    except BaseException as e:
        # What the driver reports. Stderr cannot say which error ended the process: torchft
        # logs the errors it handles with their tracebacks.
        with open(error_path(args.events, os.getpid()), "w") as f:
            f.write(f"{type(e).__name__}: {next(iter(str(e).splitlines()), '')}")
        raise
