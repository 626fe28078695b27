"""Each measurement: a cell with its fault and its reference, the steady step, the call."""

import dataclasses
import os
import statistics
import tempfile

from benchmarks.recovery.analysis import (
    analyze,
    compare_finals,
    estimate_interval,
    judge_interval,
)
from benchmarks.recovery.cells import CALL_MODES, Cell, GOALS
from benchmarks.recovery.driver import Driver, launch_group, RunFailed
from benchmarks.recovery.events import read_events


def progress(text: str) -> None:
    print(text, flush=True)


def measure_cell(args, cell: Cell) -> dict:
    """Measure one path: the run with the fault, then path new_group replaying its schedule, compared."""
    with tempfile.TemporaryDirectory() as workdir:
        driver = Driver(args, cell, workdir)
        run = analyze(driver.run(), driver.spawned, driver.victim, driver.detected_at)
        reference_cell = dataclasses.replace(cell, path="new_group")
        with tempfile.TemporaryDirectory() as refdir:
            Driver(args, reference_cell, refdir, reference=run).run()
            reference = [
                e
                for e in read_events(os.path.join(refdir, "events"))
                if e["kind"] == "final"
            ]
            run.update(
                compare_finals(
                    driver.events_dir, os.path.join(refdir, "events"), cell.world
                )
            )
        reference_digests = {str(e["slot"]): e["digest"] for e in reference}
        run["bitwise_equal_to_reference"] = run.pop("digests") == reference_digests
    return run


def measure_steady(args, cell: Cell) -> dict:
    """Measure the steady step of stock DDP and of the series, in separate processes,
    interleaved; torchft's beside them."""
    extra = ("--warmup", str(args.steady_warmup), "--steps", str(args.steady_steps))
    ratios, found = [], {"stock": [], "series": [], "torchft": []}
    for repeat in range(args.steady_repeats):
        order = ("stock", "series") if repeat % 2 == 0 else ("series", "stock")
        for flavor in order:
            events = [
                e
                for e in launch_group(
                    args, cell, "worker_steady", stock=flavor == "stock", extra=extra
                )
                if e["kind"] == "steady"
            ]
            if {e["series"] for e in events} != {flavor == "series"}:
                raise RunFailed(f"the {flavor} processes ran the other DDP")
            found[flavor].append(max(statistics.median(e["times"]) for e in events))
        ratios.append(found["series"][-1] / found["stock"][-1])
        if "torchft" in args.paths:
            with tempfile.TemporaryDirectory() as workdir:
                driver = Driver(
                    args,
                    dataclasses.replace(cell, path="torchft"),
                    workdir,
                    steady=args.steady_warmup + args.steady_steps,
                )
                times = [
                    e["t"]
                    for e in driver.run()
                    if e["kind"] == "step" and e["slot"] == 0
                ]
            found["torchft"].append(
                statistics.median(
                    (b - a) / 1e9
                    for a, b in zip(
                        times[args.steady_warmup - 1 :], times[args.steady_warmup :]
                    )
                )
            )
        progress(
            f"    steady {repeat + 1}/{args.steady_repeats}: "
            + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in found.items() if v)
        )
    mean, low, high = estimate_interval(ratios)
    result = {
        "repeats": args.steady_repeats,
        "stock_step_s": statistics.median(found["stock"]),
        "series_step_s": statistics.median(found["series"]),
        "series_over_stock": mean,
        "interval_95": [low, high],
        "verdict": judge_interval(low, high, GOALS["steady_over_stock"]),
    }
    if found["torchft"]:
        torchft = [t / s for t, s in zip(found["torchft"], found["stock"])]
        mean, low, high = estimate_interval(torchft)
        result.update(
            torchft_step_s=statistics.median(found["torchft"]),
            torchft_over_stock=mean,
            torchft_interval_95=[low, high],
        )
    return result


def measure_call(args, cell: Cell) -> dict:
    """Measure the _update_process_group call against its collectives alone."""
    events = launch_group(
        args, cell, "worker_call", extra=("--repeats", str(args.call_repeats))
    )
    calls = [e["results"] for e in events if e["kind"] == "call"]
    result = {}
    for mode in CALL_MODES:
        # The slowest rank's call, against the slowest rank's sum of the collectives alone.
        call = max(c[mode]["call_s"] for c in calls)
        collectives = max(sum(x["s"] for x in c[mode]["collectives"]) for c in calls)
        result[mode] = {
            "call_s": call,
            "collectives_s": collectives,
            "call_over_collectives": call / collectives,
            "rounds": len(calls[0][mode]["collectives"]),
            "collectives": [
                {"kind": x["kind"], "bytes": x["bytes"]}
                for x in calls[0][mode]["collectives"]
            ],
            "met": call / collectives <= GOALS["call_over_collectives"],
        }
    return result
