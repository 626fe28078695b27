"""The results file, benchmarks/results/recovery_after_lost_rank.json: read it, write it.

A cell holds a list of runs, each with the version of its path's recovery
(cells.PATH_VERSIONS). Files written before the benchmark became a package name the paths
a_reconfigure, a, torchft and c; files written before issue 32 hold one run per cell, keyed
without the detection. Reading one gives it the form of now: its runs are of version 1, and
their detection is the one they had, the local agent (torchft: its lighthouse).
"""

import json
import pathlib
from typing import List

from benchmarks.recovery.cells import find_detection, PATH_VERSIONS

FILE_NAME = "recovery_after_lost_rank.json"
# The paths' names before the package, and now.
RENAMED_PATHS = {
    "a_reconfigure": "reconfigure",
    "a": "new_group",
    "c": "restart",
}


def migrate_cell_key(key: str) -> str:
    """Return a cell's key of any version as the key of now: the path's name of now, and the
    detection, which keys before issue 32 leave out."""
    parts = key.split("-")
    path = RENAMED_PATHS.get(parts[-1], parts[-1])
    if len(parts) == 5:  # w2-1M-none-backward-a
        parts.insert(4, find_detection(path, parts[3], "local_agent"))
    return "-".join(parts[:-1] + [path])


def migrate_cell(cell: dict) -> dict:
    """Return a cell of any version as a list of runs: a cell before issue 32 was one run."""
    if "runs" in cell:
        return cell
    return {"runs": [{**cell, "version": 1}]}


def load(path: pathlib.Path) -> dict:
    """Read the results file at ``path`` (empty where there is none), in the form of now."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data["cells"] = {
        migrate_cell_key(key): migrate_cell(cell)
        for key, cell in data.get("cells", {}).items()
    }
    for section in ("steady", "call", "instructions"):
        data.setdefault(section, {})
    return data


def save(data: dict, path: pathlib.Path) -> None:
    """Write the results file: what every measurement adds, at once."""
    path.write_text(json.dumps(data, indent=1) + "\n")


def select_current_runs(data: dict, key: str) -> List[dict]:
    """Return the runs of cell ``key`` made with its path's recovery of now."""
    path = key.rsplit("-", 1)[1]
    runs = data["cells"].get(key, {"runs": []})["runs"]
    return [run for run in runs if run.get("version", 1) == PATH_VERSIONS[path]]
