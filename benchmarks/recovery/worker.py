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
import threading
from typing import Callable, List

import torch
import torch.distributed as dist
import torch.nn as nn
from benchmarks.model import LanguageModel, SEQUENCE, SIZES, VOCAB

from benchmarks.recovery.events import Events, locate_error_file
from benchmarks.recovery.socket_abort import SocketAbort

BATCH = 4
# The threads of this process that talk to the store (Heartbeat, SocketAbort), stopped
# before it exits.
STOPPED_AT_EXIT: List = []


def make_batch(step: int, slot: int):
    """Return the tokens of ``slot`` at ``step``: a new process in a lost one's slot trains on its data."""
    gen = torch.Generator().manual_seed(1000 * step + slot)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def hash_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Hash the parameters and Adam's state, bit for bit."""
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


class Heartbeat:
    """Adds 1 to the store's ``beats/SLOT`` every ``period_s``, from a thread and a store
    client of its own: the store-based membership's detector takes a member whose count stops
    as lost. A process stopped by SIGSTOP stops beating with it.
    """

    def __init__(self, args, period_s: float):
        self.store = dist.TCPStore(
            args.host,
            args.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=args.timeout),
        )
        self.key, self.period_s = f"beats/{args.slot}", period_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.beat, name="heartbeat")
        self.thread.start()

    def beat(self) -> None:
        while not self.stopped.is_set():
            try:
                self.store.add(self.key, 1)
            except RuntimeError:
                return  # the store is gone: the run is over
            self.stopped.wait(self.period_s)

    def stop(self) -> None:
        """Return once the thread has ended: one inside a store call while the interpreter
        finalizes aborts the process."""
        self.stopped.set()
        self.thread.join()


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
        if args.heartbeat_period:
            STOPPED_AT_EXIT.append(Heartbeat(args, args.heartbeat_period))
        if args.abort_by_socket_shutdown:
            # After the store's clients: the sockets it may shut down are the ones after it.
            STOPPED_AT_EXIT.append(
                SocketAbort(
                    args.host,
                    args.port,
                    args.timeout,
                    lambda count: self.events.log("aborted", sockets=count),
                )
            )

    def compile_net(self, ddp: nn.Module) -> nn.Module:
        return torch.compile(ddp) if self.args.compile == "inductor" else ddp

    def die_if_due(self, step: int) -> None:
        """Die where ``step`` is the kill's and the kill comes between steps: before the
        process starts the step, after it completed the one before on every replica.
        """
        if self.args.kill_step == step and self.args.kill_in == "between_steps":
            self.die(step)

    def run_backward(self, net: nn.Module, step: int) -> None:
        """Run the forward and backward pass of ``step``; where it is the kill's, and the kill
        comes in the backward pass (or the process hangs there), the process dies in it.
        """
        if self.args.kill_step == step and self.args.kill_in in ("backward", "hang"):
            # The embedding's gradient comes last, after the other buckets' allreduces started.
            self.model.embed.weight.register_hook(lambda grad: self.die(step))
        inputs, targets = make_batch(step, self.slot)
        self.loss_fn(net(inputs).flatten(0, 1), targets.flatten()).backward()

    def train_step(self, net: nn.Module, step: int) -> None:
        self.run_backward(net, step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def init_whole_group(self, prefix: str) -> None:
        """Initialize the default group of every process the driver started, ranked by slot."""
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(prefix, self.store),
            rank=self.slot,
            world_size=self.args.world,
        )

    def die(self, step: int) -> None:
        """End this process with SIGKILL, or where the fault is a hang, stop it (SIGSTOP): it
        then holds its connections open, and the driver kills it once the run is past it.
        """
        hang = self.args.kill_in == "hang"
        self.events.log("kill", step=step, how="hang" if hang else "kill")
        os.kill(os.getpid(), signal.SIGSTOP if hang else signal.SIGKILL)

    def finish(self, step: int, graphs_after_warmup: int) -> None:
        """Log the state at the end, and save the parameters, for the comparison with the reference."""
        self.events.log(
            "final",
            step=step,
            digest=hash_state(self.model, self.optimizer),
            graphs_after_warmup=graphs_after_warmup,
        )
        parameters = [p.detach() for p in self.model.parameters()]
        torch.save(parameters, os.path.join(self.args.events, f"final-{self.slot}.pt"))


def parse_arguments() -> argparse.Namespace:
    """Parse what the driver passes to a worker."""
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
    parser.add_argument(
        "--heartbeat-period",
        type=float,
        default=0.0,
        help="seconds between heartbeats into the store; 0: none",
    )
    parser.add_argument(
        "--abort-by-socket-shutdown",
        action="store_true",
        help="shut down the group's sockets once the store key abort is set (a stand-in for "
        "a Gloo abort, not the recipe)",
    )
    parser.add_argument(
        "--hold-before-kill-step",
        action="store_true",
        help="a survivor waits for the store key hold/released before the step of the kill "
        "(a test's way to have the loss known between steps)",
    )
    parser.add_argument("--lighthouse", help="torchft's lighthouse address")
    parser.add_argument(
        "--restarted",
        action="store_true",
        help="a process of a restart (path restart), or torchft's new process",
    )
    return parser.parse_args()


def run(main: Callable[[argparse.Namespace], int]) -> int:
    """Run a worker's ``main`` on the driver's arguments; record the exception that ends it."""
    args = parse_arguments()
    try:
        return main(args)
    except BaseException as e:
        # What the driver reports. Stderr cannot say which error ended the process: torchft
        # logs the errors it handles with their tracebacks.
        with open(locate_error_file(args.events, os.getpid()), "w") as f:
            f.write(f"{type(e).__name__}: {next(iter(str(e).splitlines()), '')}")
        raise
    finally:
        for thread in STOPPED_AT_EXIT:
            thread.stop()
