"""One pytest run of scripts/test, its outcomes and reruns, and the summary of runs."""

import collections
import dataclasses
import json
import os
import pathlib
import tempfile
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Tuple

import _common

# A test that fails for a reason that comes from the machine rather than from the code under
# test runs again (pytest-rerunfailures), up to RERUNS times, RERUN_DELAY_S after the failed
# run's ranks were told to end; a test that fails every time fails. Only one such failure is
# known: a Gloo peer that drops the TCP connection while a new process group connects its full
# mesh, seen in CI on 2 cores (torch 2.11.0, in dist.new_group(): "Gloo connectFullMesh failed
# with [.../gloo/transport/tcp/pair.cc:547] Connection closed by peer"). It must be one rank's
# traceback: the group's construction, then (the lines between are indented) Gloo's error, so
# that a rank's own failure and another rank's lost peer do not add up to it. A peer lost in a
# collective, a timeout or a hang is what the tests look for, and fails at once.
RERUNS = 2
RERUN_DELAY_S = 5
GLOO_CONNECT_FAILED = (
    r"in _new_process_group_helper\n(?:  .*\n)*[\w.]*Error: (?:Gloo connectFullMesh failed with )?"
    r"\[[^\]\n]*gloo/transport/tcp/\w+\.cc:\d+\] Connection closed by peer"
)
# The summary names this many of the slowest tests, for CI's time budget.
SLOWEST = 10


@dataclasses.dataclass
class Run:
    """One pytest run."""

    label: str
    python: pathlib.Path
    targets: List[str]
    keyword: Optional[str] = None
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    cwd: pathlib.Path = _common.REPO
    # Whether finding no test is a result, not an error: upstream's cases of
    # distributed_test.py at a commit before the one that enables them.
    may_collect_none: bool = False
    # Filled in by execute(): test id -> "passed", "failed" or "skipped: reason".
    outcomes: Dict[str, str] = dataclasses.field(default_factory=dict)
    # Filled in by execute(): test id -> seconds, setup and teardown included.
    durations: Dict[str, float] = dataclasses.field(default_factory=dict)
    # Filled in by execute(): each failure and rerun in order, as {"test": node id,
    # "outcome": "failed" or "rerun", "cause": the last line of its message} (scripts/_failure_log.py).
    failure_log: List[Dict[str, str]] = dataclasses.field(default_factory=list)
    returncode: int = 0

    def make_command(self, junit: str, failure_log: str) -> List[str]:
        cmd = [
            str(self.python),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            f"--junitxml={junit}",
        ]
        cmd += ["-p", "_failure_log", f"--failure-log={failure_log}"]
        cmd += [
            f"--reruns={RERUNS}",
            f"--reruns-delay={RERUN_DELAY_S}",
            f"--only-rerun={GLOO_CONNECT_FAILED}",
        ]
        if self.keyword:
            cmd += ["-k", self.keyword]
        return cmd + self.targets

    def execute(self, venv_env: Dict[str, str]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            junit = os.path.join(tmp, "junit.xml")
            failure_log = os.path.join(tmp, "failures.jsonl")
            # distributed_test keeps its barrier and file stores under TEMP_DIR.
            for sub in ("barrier", "test_dir"):
                os.mkdir(os.path.join(tmp, sub))
            env = {**venv_env, "TEMP_DIR": tmp, **self.env}
            # Where pytest finds the plugin that writes the failure log: last, so that it shadows nothing.
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [env.get("PYTHONPATH"), str(_common.SCRIPTS)])
            )
            _common.progress(
                f"{self.label}: {' '.join(self.targets)}"
                + (f" -k {self.keyword!r}" if self.keyword else "")
            )
            self.returncode = _common.run(
                self.make_command(junit, failure_log), cwd=self.cwd, env=env
            ).returncode
            if self.returncode == 5 and not self.may_collect_none:
                _common.die(f"{self.label}: pytest collected no tests")
            if os.path.exists(junit):
                self.outcomes, self.durations = read_junit(junit)
            if os.path.exists(failure_log):
                with open(failure_log) as f:
                    self.failure_log = [json.loads(line) for line in f]


def read_junit(path: str) -> Tuple[Dict[str, str], Dict[str, float]]:
    """Read each test's outcome and duration from a JUnit XML report."""
    outcomes, durations = {}, {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        durations[name] = float(case.get("time") or 0)
        result = next(
            (c for c in case if c.tag in ("failure", "error", "skipped")), None
        )
        if result is None:
            outcomes[name] = "passed"
        elif result.tag == "skipped":
            outcomes[name] = "skipped: " + " ".join(
                (result.get("message") or "no reason given").split()
            )
        else:
            outcomes[name] = "failed"
    return outcomes, durations


def summarize(runs: List[Run]) -> int:
    """Print the summary and return the number of failures."""
    counts: collections.Counter = collections.Counter()
    skips: collections.Counter = collections.Counter()
    print("\nSummary")
    for run in runs:
        mine = collections.Counter(o.split(":")[0] for o in run.outcomes.values())
        print(
            f"  {run.label}: {mine['passed']} passed, {mine['failed']} failed, {mine['skipped']} skipped"
        )
        counts.update(mine)
        for entry in run.failure_log:
            print(f"  {entry['outcome']} {entry['test']}: {entry['cause']}")
        counts["reruns"] += sum(
            entry["outcome"] == "rerun" for entry in run.failure_log
        )
        skips.update(
            o.split(": ", 1)[1]
            for o in run.outcomes.values()
            if o.startswith("skipped")
        )
        if run.returncode not in (0, 1) and not mine["failed"]:
            print(f"  {run.label}: pytest exited with {run.returncode}")
            counts["failed"] += 1
    for reason, n in sorted(skips.items(), key=lambda item: -item[1]):
        print(f"  skipped {n}: {reason}")
    durations = [(s, test) for run in runs for test, s in run.durations.items()]
    for seconds, test in sorted(durations, reverse=True)[:SLOWEST]:
        print(f"  slowest {seconds:7.1f} s: {test}")
    reruns = (
        f", {counts['reruns']} rerun{'s' if counts['reruns'] > 1 else ''}"
        if counts["reruns"]
        else ""
    )
    print(
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped{reruns}"
    )
    return counts["failed"]


def collect(
    python: pathlib.Path, test_file: pathlib.Path, env: Dict[str, str]
) -> List[str]:
    """Collect the node ids of the tests in ``test_file``."""
    result = _common.run(
        [
            python,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            test_file,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=test_file.parent,
    )
    return [line for line in result.stdout.splitlines() if "::" in line]
