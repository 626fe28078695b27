"""The recovery benchmark's analysis and results file, without running it: the arithmetic of
the verdicts, the counts of a made-up run, the errors a run reports, the instruction count's
dump and client requests, and the committed results as docs/benchmark.md shows them."""

import ctypes
import json
import pathlib
import shutil

import pytest

from benchmarks.recovery import (
    analysis,
    driver as driver_module,
    instructions,
    report,
    results,
)
from benchmarks.recovery.cells import PATH_VERSIONS
from benchmarks.recovery.events import locate_error_file
from benchmarks.recovery.membership import HeartbeatDetector

REPO = pathlib.Path(__file__).resolve().parents[2]

RESULTS = REPO / "benchmarks" / "results" / results.FILE_NAME


def test_interval_and_verdict():
    mean, low, high = analysis.estimate_interval([1.0, 1.0, 1.0])
    assert (mean, low, high) == (1.0, 1.0, 1.0)
    assert analysis.judge_interval(0.99, 1.01, 1.02) == "met"
    assert analysis.judge_interval(1.03, 1.05, 1.02) == "not met"
    assert analysis.judge_interval(1.0, 1.05, 1.02) == "inconclusive"
    assert analysis.judge_interval(None, None, 1.02) == "inconclusive"


def test_a_step_short_of_a_member():
    # 4 replicas; the last is killed at step 5 and its new process first steps at 8. The
    # survivors' steps 5 to 7 average 3 of 3. At 8, slot 0 asks for the quorum too late and is
    # left out (it heals past 8: the step is short, not lost); at 9, slot 3. At 10 every replica
    # logs the step but torchft says it averaged 3: its count wins over the slots'.
    events, t = [], 0

    def pid(slot):
        return 200 if slot == 3 and t > 100 else 100 + slot

    def step(step, slots, participants):
        nonlocal t
        for slot in slots:
            t += 1
            events.append(
                {
                    "kind": "step",
                    "t": t,
                    "slot": slot,
                    "pid": pid(slot),
                    "step": step,
                    "participants": participants,
                    "rss_mb": 100.0,
                }
            )

    for s in range(5):
        step(s, range(4), 4)
    t += 1
    events.append({"kind": "kill", "t": t, "step": 5, "slot": 3})
    for s in range(5, 8):
        step(s, range(3), 3)
    t = 101  # the new process
    step(8, (1, 2, 3), 3)
    step(9, range(3), 3)
    step(10, range(4), 3)
    events += [
        {
            "kind": "final",
            "t": t + 1,
            "slot": slot,
            "pid": pid(slot),
            "step": 11,
            "digest": "d",
            "graphs_after_warmup": 0,
        }
        for slot in range(4)
    ]
    cell = analysis.analyze(events, {200: 90}, victim=3)
    assert (cell["joined_at"], cell["lost_updates"], cell["short_steps"]) == (8, 0, 3)


def test_a_failure_names_its_exception_not_the_lines_after_it(tmp_path):
    # DDP's error for a reduction left unfinished goes on for lines after the exception's
    # first one, and ends with a hint; the cell's failure must name the exception.
    driver = object.__new__(driver_module.Driver)
    driver.events_dir = str(tmp_path)
    pathlib.Path(driver.locate_stderr(1)).write_text(
        "Traceback (most recent call last):\n"
        '  File "worker.py", line 99, in train_step\n'
        "[rank0]: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.\n"
        "Parameter indices which did not receive grad for rank 0: 0 1\n"
        " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL\n"
    )
    assert driver.read_last_error(1).startswith(
        "[rank0]: RuntimeError: Expected to have finished reduction"
    )
    # SystemExit's message names no exception: the last line.
    pathlib.Path(driver.locate_stderr(2)).write_text(
        "slot 1 saw the switch at step 3 at 4\n"
    )
    assert driver.read_last_error(2) == "slot 1 saw the switch at step 3 at 4"
    # What the process recorded wins over its stderr, where torchft logs the errors it handles.
    pathlib.Path(driver.locate_stderr(3)).write_text(
        "Traceback (most recent call last):\nRuntimeError: handled by torchft\nslot 1 is at step 9, past the end at 8\n"
    )
    pathlib.Path(locate_error_file(driver.events_dir, 3)).write_text(
        "SystemExit: slot 1 is at step 9, past the end at 8"
    )
    assert (
        driver.read_last_error(3)
        == "SystemExit: slot 1 is at step 9, past the end at 8"
    )


def test_the_committed_results_are_the_tables_of_the_docs():
    # Every row that the committed file renders is in docs/benchmark.md, and every row of the
    # docs' recovery tables comes from the file: the page shows what was measured.
    rendered = report.render_markdown(results.load(RESULTS)).splitlines()
    docs = (REPO / "docs" / "benchmark.md").read_text().splitlines()
    rows = [line for line in rendered if line.startswith("| ")]
    assert rows and [line for line in rows if line not in docs] == []
    headers = {line for line in rendered if line.startswith("| world |")}
    for header in headers:
        start = docs.index(header)
        end = next(
            (i for i in range(start, len(docs)) if not docs[i].startswith("| ")),
            len(docs),
        )
        assert set(docs[start:end]) <= set(rows), header


def test_a_file_of_before_issue_32_reads_in_the_form_of_now(tmp_path):
    # Before the package, the paths were a_reconfigure, a, torchft and c; before issue 32, a
    # cell was one run, and its key named no detection: the local agent's, torchft's own.
    old = tmp_path / results.FILE_NAME
    cell = {"kill_to_survivors_step_s": 0.1}
    old.write_text(
        json.dumps(
            {
                "cells": {
                    f"w2-1M-none-backward-{path}": cell
                    for path in ("a_reconfigure", "a", "torchft", "c")
                },
                "steady": {},
            }
        )
    )
    data = results.load(old)
    assert list(data["cells"]) == [
        "w2-1M-none-backward-local_agent-reconfigure",
        "w2-1M-none-backward-local_agent-new_group",
        "w2-1M-none-backward-lighthouse-torchft",
        "w2-1M-none-backward-local_agent-restart",
    ]
    assert data["cells"]["w2-1M-none-backward-lighthouse-torchft"] == {
        "runs": [{**cell, "version": 1}]
    }
    assert data["call"] == data["instructions"] == {}
    # Their recovery changed since: the tables leave those runs out; torchft's stay.
    assert (
        results.select_current_runs(data, "w2-1M-none-backward-local_agent-reconfigure")
        == []
    )
    assert (
        len(results.select_current_runs(data, "w2-1M-none-backward-lighthouse-torchft"))
        == 1
    )


class CountingStore:
    """A store's add() on counts the test sets."""

    def __init__(self):
        self.counts = {}

    def add(self, key, amount):
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]


def test_the_heartbeat_detector_takes_a_silent_member_as_lost():
    # Times in eighths of a second, exact in binary.
    store, now = CountingStore(), [0.0]
    detector = HeartbeatDetector(
        store, [0, 1, 2], period_s=0.125, timeout_s=1.0, clock=lambda: now[0]
    )
    for tick in range(24):  # 3 s: slot 1 beats until 0.875 s, slot 2 never beats
        now[0] = tick * 0.125
        store.add("beats/0", 1)
        if now[0] <= 0.875:
            store.add("beats/1", 1)
        # Slot 1's count last changed at 0.875 s: lost once more than 1 s has passed since.
        # Slot 2 is not watched before its first beat.
        assert detector.find_lost() == ([1] if now[0] > 1.875 else []), now[0]


def test_the_goals_compare_reconfigure_with_each_torchft_that_completes():
    def run(recovery, **fields):
        return {
            "version": PATH_VERSIONS["reconfigure"],
            "kill_to_survivors_step_s": recovery,
            "lost_updates": 0,
            "bitwise_equal_to_reference": True,
            **fields,
        }

    data = {
        "cells": {
            "w4-1M-none-backward-local_agent-reconfigure": {
                "runs": [run(0.2), run(0.3), run(0.25)]
            },
            "w4-1M-none-backward-lighthouse-torchft": {
                "runs": [{"version": 1, "error": "RunFailed: x"}]
            },
            "w4-1M-none-backward-lighthouse-torchft_nightly": {
                "runs": [
                    {**run(1.1), "version": 1},
                    {**run(1.0), "version": 1},
                    {**run(1.2), "version": 1},
                ]
            },
        }
    }
    (row,) = report.format_goal_rows(data)
    assert row == (
        "| 4 | 1M | none | killed in backward | local agent | 0.25 (0.20 to 0.30) "
        "| did not complete (0 of 1 runs did) | 1.10 (1.00 to 1.20) | yes | yes | yes |"
    )


def test_the_instruction_count_is_the_totals_line_of_the_steps_dump(tmp_path):
    # A callgrind dump as --callgrind-out-file writes it at CALLGRIND_DUMP_STATS_AT("steps"):
    # the count is its totals line; a dump without one fails the count instead of reading 0.
    dump = tmp_path / "callgrind.out.123.1"
    dump.write_text(
        "version: 1\ncreator: callgrind-3.19.0\ncmd: python\npart: 1\n"
        "desc: Trigger: Client Request: steps\nevents: Ir\n"
        "fn=(1) main\n0 5\nsummary: 134069876\ntotals: 134069876\n"
    )
    assert instructions.read_instruction_count(dump) == 134069876
    dump.write_text("version: 1\nevents: Ir\n")
    with pytest.raises(instructions.CountFailed, match="has no totals"):
        instructions.read_instruction_count(dump)


@pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("gcc") is None,
    reason="needs valgrind and gcc (apt-get install -y valgrind gcc)",
)
def test_the_client_requests_compile_into_a_library_with_both_calls(tmp_path):
    library = instructions.build_helper(tmp_path)
    helper = ctypes.CDLL(str(library))
    assert helper.steps_begin and helper.steps_end
    # Outside valgrind the client requests do nothing, so the worker's calls are safe.
    helper.steps_begin()
    helper.steps_end()
