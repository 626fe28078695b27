"""The event logs the workers write and the driver reads, and the error each worker records."""

import json
import os
import pathlib
import time
from typing import List, Optional


class Events:
    """One JSON line per event, appended with os.write, so that a SIGKILL loses nothing written.

    Times are time.monotonic_ns(), one clock for every process of the machine.
    """

    def __init__(self, directory: str, slot: int):
        self.slot = slot
        name = os.path.join(directory, f"{slot}-{os.getpid()}.jsonl")
        self.fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def log(self, kind: str, **fields) -> None:
        record = {
            "kind": kind,
            "t": time.monotonic_ns(),
            "slot": self.slot,
            "pid": os.getpid(),
            **fields,
        }
        os.write(self.fd, (json.dumps(record) + "\n").encode())


def read_events(directory: str) -> List[dict]:
    """Read every event that the processes of ``directory`` logged, in time order."""
    found = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as f:
                found += [json.loads(line) for line in f if line.endswith("\n")]
    return sorted(found, key=lambda e: e["t"])


def locate_error_file(events_dir: str, pid: int) -> str:
    """Return where process ``pid`` records the exception that ended it."""
    return os.path.join(events_dir, f"error-{pid}.txt")


def read_recorded_error(events_dir: str, pid: int) -> Optional[str]:
    """Return the exception that process ``pid`` recorded, or None where it recorded none."""
    path = pathlib.Path(locate_error_file(events_dir, pid))
    return path.read_text() if path.exists() else None
