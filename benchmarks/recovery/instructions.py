"""The instructions of one-rank steps, stock DDP against the series, counted by callgrind.

This machine has no hardware counters, and its step times vary by more than the 2% goal of
the steady step. Callgrind (valgrind) counts every instruction the process runs, on every
thread, between two client requests around a fixed number of steps (the start-up, the import
and the warm-up are not counted: --instr-atstart=no). Stock and series run in separate
processes, twice each, interleaved. The series' forward-pass check is timed alone too.
"""

import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict

from benchmarks.recovery.cells import GOALS
from benchmarks.recovery.driver import make_worker_command

HELPER_SOURCE = """
#include <valgrind/callgrind.h>
void steps_begin(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void steps_end(void) { CALLGRIND_DUMP_STATS_AT("steps"); CALLGRIND_STOP_INSTRUMENTATION; }
"""
ORDER = ("stock", "series", "series", "stock")


class CountFailed(Exception):
    pass


def build_helper(directory: pathlib.Path) -> pathlib.Path:
    """Compile the client requests into a shared library the worker loads with ctypes."""
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            raise CountFailed(f"needs {tool} (apt-get install -y valgrind gcc)")
    source, library = directory / "helper.c", directory / "libsteps.so"
    source.write_text(HELPER_SOURCE)
    result = subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise CountFailed(
            f"compiling the client requests failed: {result.stderr[-300:]}"
        )
    return library


def read_instruction_count(dump: pathlib.Path) -> int:
    """Return the instructions of a callgrind dump (its totals line)."""
    match = re.search(r"^totals: (\d+)", dump.read_text(), re.M)
    if match is None:
        raise CountFailed(f"{dump} has no totals")
    return int(match.group(1))


def count_once(
    flavor: str, size: str, steps: int, directory: pathlib.Path, helper
) -> int:
    """Return the instructions of ``steps`` steps in a process of ``flavor``."""
    run = pathlib.Path(tempfile.mkdtemp(dir=directory))
    env = dict(os.environ)
    command = make_worker_command("worker_instructions", env, stock=flavor == "stock")
    out = run / "result.json"
    result = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={run}/callgrind.out.%p",
            *command,
            "--size",
            size,
            "--steps",
            str(steps),
            "--helper",
            str(helper),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 or not out.exists():
        raise CountFailed(
            f"the {flavor} process exited with {result.returncode}: {result.stderr[-300:]}"
        )
    if json.loads(out.read_text())["series"] != (flavor == "series"):
        raise CountFailed(f"the {flavor} process ran the other DDP")
    dumps = [
        d
        for d in run.glob("callgrind.out.*.*")
        if "Client Request: steps" in d.read_text()
    ]
    if len(dumps) != 1:
        raise CountFailed(f"expected one dump of the steps, found {len(dumps)}")
    return read_instruction_count(dumps[0])


def time_check(size: str, directory: pathlib.Path) -> dict:
    """Time the series' forward-pass check in a process of the series, outside valgrind."""
    env = dict(os.environ)
    out = directory / "check.json"
    command = make_worker_command("worker_instructions", env)
    result = subprocess.run(
        [*command, "--size", size, "--time-check", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise CountFailed(f"timing the check failed: {result.stderr[-300:]}")
    return json.loads(out.read_text())


def measure_instructions(args, size: str) -> dict:
    """Count the instructions per step of stock and series; time the series' check."""
    with tempfile.TemporaryDirectory() as workdir:
        directory = pathlib.Path(workdir)
        helper = build_helper(directory)
        counts: Dict[str, list] = {"stock": [], "series": []}
        for flavor in ORDER:
            counts[flavor].append(
                count_once(flavor, size, args.instructions_steps, directory, helper)
                / args.instructions_steps
            )
            print(
                f"    {flavor}: {counts[flavor][-1]:,.0f} instructions a step",
                flush=True,
            )
        check = time_check(size, directory)
    stock, series = (statistics.mean(counts[f]) for f in ("stock", "series"))
    return {
        "steps": args.instructions_steps,
        "python": sys.version.split()[0],
        "stock_per_step": counts["stock"],
        "series_per_step": counts["series"],
        "series_over_stock": series / stock,
        "met": series / stock <= GOALS["instructions_over_stock"],
        **check,
    }
