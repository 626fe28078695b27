"""Recovery after a lost rank: DDP following its group, against torchft 0.2.0 and a restart.

python -m benchmarks.recovery [options], from the repository's root, in the overlay venv of
v2.14.1 (scripts/benchmark --base v2.14.1 runs it there).

For each world size, model size and compile mode, a driver starts one process per replica
(Gloo on CPU, a TCPStore the driver hosts), trains the transformer of
resume_after_membership_change.py with Adam, SIGKILLs the last replica at step --kill-step,
and starts a new process in its place once the survivors have completed --join-after further
steps. The kill comes inside the replica's backward pass, or between steps (--kill-in; both by
default). Paths:

  reconfigure  every process keeps one group for the whole run and reconfigures it in
               place (dist._reconfigure); DDP follows with _update_process_group()
  new_group    destroy and init the default group, then _update_process_group()
  torchft      torchft's Manager, its DistributedDataParallel and its reconfigurable Gloo
               group, with a lighthouse the driver starts (its timeouts are reported)
  restart      a restart of every process, as TorchElastic does: from a checkpoint written
               after every step, on the loss and again on the join

How a joining process is admitted: in reconfigure and new_group it builds, wraps and compiles
its model and runs a step on a group of its own (the warm-up), then the driver admits it, and
the first survivor chooses the next step boundary, which no member can have passed yet. The
call broadcasts the parameters and buffers from a member (sync_module_states=True), and a
member broadcasts Adam's state; in torchft the joiner heals from a member through torchft's
checkpoint transport inside its first quorum (use_async_quorum=False); in restart every
process loads the checkpoint. Detection differs: in reconfigure and new_group the driver, the
processes' parent, sees the exit at once and publishes the survivors (an oracle, a lower bound
on detection); torchft's lighthouse forms the next quorum once the lost replica's heartbeat
expires, or sooner, once a majority has asked and its join timeout has passed.

Reported per path: the time from the kill to the survivors' next completed optimizer step;
from the new process's start to its first completed step; the failed attempts (steps whose
update was discarded and done again), the updates lost for good, and the steps short of a
member (whose update averaged fewer replicas' gradients than the run had members); whether
every process's parameters and Adam state at the end equal those of a reference run, path
new_group replayed with the same membership schedule and no fault (bitwise, else the largest
difference of a parameter); the graphs compiled after each process's warm-up; the peak RSS of
a step during recovery over the steady state's; the steady step time.

Then, for the same configurations, with no fault: the steady step of stock DDP against the
series (stock in processes that load the wheel's original Python files; interleaved, repeated,
a 95% interval of the ratio and a verdict against GOALS), torchft's beside them; and the cost
of the _update_process_group call against the collectives it makes, each timed alone on the
same group with the same payloads.

Writes a table to stdout, recovery_after_lost_rank.json to --out, a file that every
measurement updates, so that a run that stops can go on (--paths, --kill-in, --worlds, --sizes,
--compile and --skip choose what runs), and a plot of the file, recovery_after_lost_rank.png.
Needs torch 2.14 with the series (the overlay venv of v2.14.1) and torchft 0.2.0. The worker
processes are modules of this package (python -m benchmarks.recovery.worker_replica, ...).
"""

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import itertools
import os
import pathlib
import sys
from typing import Dict

import torch
import torch.distributed as dist

from benchmarks.recovery import report, results
from benchmarks.recovery.cells import Cell, GOALS, KILL_IN, PATHS
from benchmarks.recovery.driver import RunFailed
from benchmarks.recovery.measure import (
    measure_call,
    measure_cell,
    measure_steady,
    progress,
)
from benchmarks.resume_after_membership_change import SIZES


def main() -> int:
    """Measures what the options choose and the file lacks; prints the table, writes the plot."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.recovery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["1M", "10M"],
        choices=sorted(SIZES),
        help="100M runs on 2 ranks only",
    )
    parser.add_argument(
        "--compile",
        nargs="+",
        default=["none", "inductor"],
        choices=["none", "inductor"],
    )
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument(
        "--steps-after-join",
        type=int,
        default=5,
        help="steps of a run after the new process's first",
    )
    parser.add_argument("--kill-step", type=int, default=5)
    parser.add_argument(
        "--kill-in",
        nargs="+",
        default=list(KILL_IN),
        choices=KILL_IN,
        help="where the replica is killed: inside its backward pass (from a hook on the embedding's "
        "gradient, after the other buckets' allreduces started), or between steps (before it starts "
        "the step of the kill, after every replica completed the one before)",
    )
    parser.add_argument(
        "--join-after",
        type=int,
        default=3,
        help="steps the survivors complete before the new process starts",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="of stores and the driver's waits, in seconds",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=10.0,
        help="of the groups' collectives, in seconds: in Gloo's ring, a survivor that is not the "
        "lost rank's neighbor learns of the loss only when its collective times out",
    )
    parser.add_argument("--lighthouse-heartbeat-timeout-ms", type=int, default=1000)
    parser.add_argument("--lighthouse-join-timeout-ms", type=int, default=100)
    parser.add_argument("--lighthouse-tick-ms", type=int, default=100)
    parser.add_argument("--steady-repeats", type=int, default=6)
    parser.add_argument("--steady-warmup", type=int, default=3)
    parser.add_argument("--steady-steps", type=int, default=20)
    parser.add_argument("--call-repeats", type=int, default=10)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["recovery", "steady", "call"]
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the file's measurements as Markdown tables (with --skip recovery steady call, "
        "and nothing is measured)",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="measure again what the file in --out already has (by default kept, so that a run "
        "that stopped goes on where it stopped)",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path(__file__).resolve().parents[1] / "results",
    )
    args = parser.parse_args()
    if "torchft" in args.paths and importlib.util.find_spec("torchft") is None:
        parser.error(
            "path torchft needs torchft 0.2.0 (pip install torchft==0.2.0), or leave it out of --paths"
        )
    if "reconfigure" in args.paths and not hasattr(dist, "_reconfigure"):
        parser.error(
            f"path reconfigure needs torch 2.14 or later; this is {torch.__version__}"
        )
    if args.kill_step < 2 or args.steps_after_join < 3:
        parser.error(
            "--kill-step must be at least 2 (a step after the first), --steps-after-join at least 3"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / results.FILE_NAME
    data = results.load(out)
    data["machine"] = {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torchft": importlib.util.find_spec("torchft")
        and importlib.metadata.version("torchft"),
    }
    data["lighthouse"] = {
        "heartbeat_timeout_ms": args.lighthouse_heartbeat_timeout_ms,
        "join_timeout_ms": args.lighthouse_join_timeout_ms,
        "quorum_tick_ms": args.lighthouse_tick_ms,
    }
    data["collective_timeout_s"] = args.collective_timeout
    data["goals"] = GOALS
    configs = [
        (w, s, c)
        for w in args.worlds
        for s in args.sizes
        for c in args.compile
        if s != "100M" or w == 2
    ]

    def measure(
        found: Dict[str, dict], key: str, what: str, function, failures
    ) -> None:
        """Runs ``function`` into ``found[key]`` and saves the file, unless an earlier run did."""
        if key in found and not args.again:
            progress(
                f"[{key}] {what}: kept from the run of {found[key].get('date', 'an earlier day')} "
                "(--again measures it again)"
            )
            return
        progress(f"[{key}] {what}")
        try:
            result = function()
        except failures as e:
            result = {"error": f"{type(e).__name__}: {e}"}
        found[key] = {**result, "date": datetime.date.today().isoformat()}
        results.save(data, out)

    for world, size, compile_mode in configs:
        base = Cell(world, size, compile_mode, "new_group")
        if "recovery" not in args.skip:
            for kill_in, path in itertools.product(args.kill_in, args.paths):
                cell = dataclasses.replace(base, path=path, kill_in=kill_in)
                measure(
                    data["cells"],
                    cell.key,
                    f"a replica killed at step {args.kill_step} ({kill_in}), then replaced",
                    lambda: measure_cell(args, cell),
                    (RunFailed, StopIteration, ValueError),
                )
        if "steady" not in args.skip:
            measure(
                data["steady"],
                f"w{world}-{size}-{compile_mode}",
                "steady step: stock, series, torchft",
                lambda: measure_steady(args, base),
                RunFailed,
            )
        if "call" not in args.skip and compile_mode == "none":
            measure(
                data["call"],
                f"w{world}-{size}",
                "the call against its collectives",
                lambda: measure_call(args, base),
                RunFailed,
            )
    print(report.markdown(data) if args.markdown else report.table(data))
    report.plot(data, out.with_suffix(".png"))
    progress(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
