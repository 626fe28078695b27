"""Recovery after a lost rank: DDP following its group, against torchft and a restart.

python -m benchmarks.recovery [options], from the repository's root, in the overlay venv of
v2.14.1 (scripts/benchmark --base v2.14.1 runs it there).

For each world size, model size and compile mode, a driver starts one process per replica
(Gloo on CPU, a TCPStore the driver hosts), trains the resume benchmark's transformer
(benchmarks/model.py) with Adam, and at step --kill-step SIGKILLs the last replica
inside its backward pass or between steps, or stops it (SIGSTOP) inside its backward pass, a
hung process (--kill-in; all three by default). Once the survivors have completed --join-after
further steps, a new process takes its place. Paths:

  reconfigure      every process keeps one group for the whole run and reconfigures it in
                   place (dist._reconfigure); DDP follows with _update_process_group()
  new_group        destroy and init the default group, then _update_process_group()
  torchft          torchft 0.2.0's Manager, its DistributedDataParallel and its
                   reconfigurable Gloo group, with a lighthouse the driver starts
  torchft_nightly  torchft-nightly 2026.10.26 the same way, in a venv of its own
                   (scripts/benchmark --torchft-nightly makes it), on a native Gloo group
  restart          a restart of every process, as TorchElastic does: from a checkpoint
                   written after every step, on the loss and again on the join

In reconfigure and new_group a survivor whose step fails releases the failed group at once
(examples/elastic_ddp.py's release_failed_group), so that a peer blocked in the same
collective fails too; before each step it checks the membership key, and skips the attempt
where the loss is already known; the shrink to the survivors skips sync_module_states.

Who detects the loss (--detection): the local agent, the processes' parent, which sees the
exit status at once (a crash only); or a store-based membership, whose detector takes a
member whose heartbeats stopped for --heartbeat-timeout as lost (any fault; a hang always uses
it). torchft's lighthouse does its own. A hung peer's collectives end only at the group's
timeout (--collective-timeout): nothing aborts a Gloo collective in torch 2.14.1.

How a joining process is admitted: in reconfigure and new_group it builds, wraps and compiles
its model and runs a step on a group of its own (the warm-up), then the driver admits it, and
the first survivor chooses the next step boundary, which no member can have passed yet. The
call broadcasts the parameters and buffers from a member (sync_module_states=True), and a
member broadcasts Adam's state; in torchft the joiner heals from a member inside its first
quorum (use_async_quorum=False); in restart every process loads the checkpoint.

Reported per run: the time from the kill to the survivors' next completed optimizer step; to
the last survivor's failure and to the detection; from the new process's start to its first
completed step; the failed attempts (steps whose update was discarded and done again), the
updates lost for good, and the steps short of a member; whether every process's parameters
and Adam state at the end equal those of a reference run, path new_group replayed with the
same membership schedule and no fault; the graphs compiled after each process's warm-up; the
peak RSS of a step during recovery over the steady state's; the membership check's time.
Each cell runs --runs times (by default 3 for 4 ranks at 1M and 10M and 2 ranks at 1M without
compile, else 1); the tables give the median and the range.

Then, for the same configurations, with no fault: the steady step of stock DDP against the
series (stock in processes that load the wheel's original Python files; interleaved, repeated,
a 95% interval of the ratio and a verdict against GOALS), torchft's beside them; the cost of
the _update_process_group call against the collectives it makes, each timed alone; and the
instructions of a fixed number of one-rank steps, stock against series, counted by callgrind
(valgrind), with the forward pass's reconfigure check timed alone.

Writes a table to stdout, recovery_after_lost_rank.json to --out, a file that every
measurement updates, so that a run that stops goes on where it stopped (--paths, --kill-in,
--worlds, --sizes, --compile, --runs and --skip choose what runs), and a plot of the file,
recovery_after_lost_rank.png. Needs torch 2.14 with the series (the overlay venv of v2.14.1)
and torchft 0.2.0. The worker processes are modules of this package (python -m
benchmarks.recovery.worker_replica, ...). Never run in CI: its test runs a tiny model.
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
from typing import Callable, Dict

import torch
import torch.distributed as dist
from benchmarks.model import SIZES

from benchmarks.recovery import instructions, plot, report, results
from benchmarks.recovery.cells import (
    Cell,
    find_detection,
    GOALS,
    KILL_IN,
    PATH_VERSIONS,
    PATHS,
)
from benchmarks.recovery.driver import RunFailed, TORCHFT_NIGHTLY_VENV
from benchmarks.recovery.measure import (
    measure_call,
    measure_cell,
    measure_steady,
    progress,
)

# The configurations whose cells run three times by default (issue 32): the others once.
THREE_RUNS = {(4, "1M", "none"), (4, "10M", "none"), (2, "1M", "none")}
SKIPPABLE = ("recovery", "steady", "call", "instructions")


def parse_arguments() -> argparse.Namespace:
    """Parse the command line, and check that what it chooses can run here."""
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
        "--runs",
        type=int,
        help="runs of each cell (default: 3 for 4 ranks at 1M and 10M and 2 ranks at 1M "
        "without compile, else 1); a cell that has fewer runs of its path's recovery of now "
        "gets more",
    )
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
        help="the fault: the replica SIGKILLed inside its backward pass (from a hook on the "
        "embedding's gradient, after the other buckets' allreduces started), or between steps "
        "(before it starts the step of the kill, after every replica completed the one "
        "before), or stopped with SIGSTOP inside its backward pass (hang)",
    )
    parser.add_argument(
        "--detection",
        nargs="+",
        default=["local_agent"],
        choices=[
            "local_agent",
            "heartbeat",
            "heartbeat_fence",
            "heartbeat_socket_shutdown",
        ],
        help="who detects a kill in reconfigure, new_group and restart: the local agent (the "
        "exit status) or the store-based membership (heartbeats); a hang uses the heartbeats "
        "where the local agent is chosen; torchft its lighthouse. heartbeat_fence: the "
        "heartbeats, then the lost process is killed, as its host's agent would on the "
        "detector's word. heartbeat_socket_shutdown: "
        "the heartbeats, then each survivor shuts down its group's sockets by hand, a stand-in "
        "for a Gloo abort (not the recipe; it measures what a real abort would give)",
    )
    parser.add_argument(
        "--heartbeat-period",
        type=float,
        default=0.1,
        help="seconds between a member's heartbeats, and between the detector's reads",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=1.0,
        help="seconds without a heartbeat after which the detector takes a member as lost",
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
        help="of the groups' collectives, in seconds: a survivor blocked on a hung peer waits "
        "this long",
    )
    parser.add_argument("--lighthouse-heartbeat-timeout-ms", type=int, default=1000)
    parser.add_argument("--lighthouse-join-timeout-ms", type=int, default=100)
    parser.add_argument("--lighthouse-tick-ms", type=int, default=100)
    parser.add_argument("--steady-repeats", type=int, default=6)
    parser.add_argument("--steady-warmup", type=int, default=3)
    parser.add_argument("--steady-steps", type=int, default=20)
    parser.add_argument("--call-repeats", type=int, default=10)
    parser.add_argument(
        "--instructions-sizes",
        nargs="+",
        default=["1M"],
        choices=sorted(SIZES),
        help="the model sizes whose one-rank steps callgrind counts",
    )
    parser.add_argument(
        "--instructions-steps",
        type=int,
        default=10,
        help="the one-rank steps whose instructions callgrind counts, after 3 of warm-up",
    )
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=SKIPPABLE,
        help="recovery: the cells with a fault; steady: the steady step; call: the call; "
        "instructions: the instruction counts (all four: the file's tables, measuring nothing)",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="measure again what the file in --out already has: the chosen cells' runs of "
        "now are replaced (by default kept, so that a run that stopped goes on where it "
        "stopped)",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path(__file__).resolve().parents[1] / "results",
    )
    parser.add_argument(
        "--hold-survivors-at-the-kill",
        action="store_true",
        help=argparse.SUPPRESS,  # a test's: the survivors wait before the kill's step
    )
    args = parser.parse_args()
    measures_recovery = "recovery" not in args.skip
    if (
        measures_recovery
        and "torchft" in args.paths
        and importlib.util.find_spec("torchft") is None
    ):
        parser.error(
            "path torchft needs torchft 0.2.0 (pip install torchft==0.2.0), or leave it out of --paths"
        )
    if (
        measures_recovery
        and "torchft_nightly" in args.paths
        and not (TORCHFT_NIGHTLY_VENV / "bin" / "torchft_lighthouse").exists()
    ):
        parser.error(
            f"path torchft_nightly needs torchft-nightly in {TORCHFT_NIGHTLY_VENV} "
            "(scripts/benchmark --torchft-nightly makes it), or leave it out of --paths"
        )
    if "reconfigure" in args.paths and not hasattr(dist, "_reconfigure"):
        parser.error(
            f"path reconfigure needs torch 2.14 or later; this is {torch.__version__}"
        )
    if args.kill_step < 2 or args.steps_after_join < 3:
        parser.error(
            "--kill-step must be at least 2 (a step after the first), --steps-after-join at least 3"
        )
    return args


def describe_machine() -> dict:
    """Return what the file records of the machine: its CPUs, torch's and torchft's versions."""
    return {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torchft": importlib.util.find_spec("torchft")
        and importlib.metadata.version("torchft"),
    }


def main() -> int:
    """Measure what the options choose and the file lacks; print the table, write the plot."""
    args = parse_arguments()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / results.FILE_NAME
    data = results.load(out)
    data["machine"] = describe_machine()
    data["lighthouse"] = {
        "heartbeat_timeout_ms": args.lighthouse_heartbeat_timeout_ms,
        "join_timeout_ms": args.lighthouse_join_timeout_ms,
        "quorum_tick_ms": args.lighthouse_tick_ms,
    }
    data["heartbeat"] = {
        "period_s": args.heartbeat_period,
        "timeout_s": args.heartbeat_timeout,
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
        found: Dict[str, dict], key: str, what: str, function: Callable, failures
    ) -> None:
        """Run ``function`` into ``found[key]`` and save the file, unless an earlier run did."""
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

    def measure_runs(cell: Cell, wanted: int) -> None:
        """Run ``cell`` until the file has ``wanted`` runs of its path's recovery of now."""
        entry = data["cells"].setdefault(cell.key, {"runs": []})
        version = PATH_VERSIONS[cell.path]
        if args.again:
            entry["runs"] = [r for r in entry["runs"] if r.get("version") != version]
        have = len(results.select_current_runs(data, cell.key))
        if have >= wanted:
            progress(f"[{cell.key}] kept: {have} runs (--again measures it again)")
            return
        for run in range(have, wanted):
            progress(
                f"[{cell.key}] run {run + 1} of {wanted}: the replica "
                f"{'hangs' if cell.kill_in == 'hang' else 'is killed'} at step "
                f"{args.kill_step} ({cell.kill_in}), detected by {cell.detection}, then replaced"
            )
            try:
                result = measure_cell(args, cell)
            except (RunFailed, StopIteration, ValueError) as e:
                result = {"error": f"{type(e).__name__}: {e}"}
            entry["runs"].append(
                {
                    **result,
                    "version": version,
                    "date": datetime.date.today().isoformat(),
                }
            )
            results.save(data, out)

    for world, size, compile_mode in configs:
        base = Cell(world, size, compile_mode, "new_group")
        if "recovery" not in args.skip:
            wanted = args.runs or (
                3 if (world, size, compile_mode) in THREE_RUNS else 1
            )
            for kill_in, path in itertools.product(args.kill_in, args.paths):
                for detection in sorted(
                    {find_detection(path, kill_in, d) for d in args.detection}
                ):
                    cell = dataclasses.replace(
                        base, path=path, kill_in=kill_in, detection=detection
                    )
                    measure_runs(cell, wanted)
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
    if "instructions" not in args.skip:
        for size in args.instructions_sizes:
            measure(
                data["instructions"],
                f"w1-{size}",
                f"instructions of {args.instructions_steps} one-rank steps: stock, series",
                lambda: instructions.measure_instructions(args, size),
                instructions.CountFailed,
            )
    print(report.render_markdown(data))
    plot.plot(data, out.with_suffix(".png"))
    progress(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
