"""A pytest plugin for scripts/test: writes down each failure and each rerun as it happens.

pytest's JUnit XML keeps only a test's last outcome, so a test that failed and then passed on
a rerun (pytest-rerunfailures) reads as passed there, and it names no failure's cause. With
``-p _failure_log --failure-log PATH``, every failed or rerun test phase appends a JSON line
to PATH: {"test": node id, "outcome": "failed" or "rerun", "cause": the last line of its
failure}; for a test of MultiProcessTestCase, that is the exception of the last rank that
failed. The log is written line by line, so a run that is killed keeps what came before.
"""

import json


def pytest_addoption(parser):
    parser.addoption(
        "--failure-log",
        metavar="PATH",
        help="append each failure and rerun, with its cause, to PATH",
    )


def pytest_configure(config):
    path = config.getoption("--failure-log")
    if path:
        config.pluginmanager.register(FailureLog(path), "failure_log")


def take_last_line(message: str) -> str:
    return next(
        (line.strip() for line in reversed(message.splitlines()) if line.strip()), ""
    )


class FailureLog:
    def __init__(self, path: str) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report) -> None:
        if report.outcome not in ("failed", "rerun"):
            return
        crash = getattr(report.longrepr, "reprcrash", None)
        cause = take_last_line(crash.message if crash else str(report.longrepr))
        with open(self.path, "a") as f:
            f.write(
                json.dumps(
                    {"test": report.nodeid, "outcome": report.outcome, "cause": cause}
                )
                + "\n"
            )
