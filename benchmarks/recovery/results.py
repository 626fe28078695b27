"""The results file, benchmarks/results/recovery_after_lost_rank.json: read it, write it.

Files written before the benchmark became a package name the paths a_reconfigure, a, torchft
and c; reading one gives them their names of now.
"""

import json
import pathlib

FILE_NAME = "recovery_after_lost_rank.json"
# The paths' names before the package, and now.
RENAMED_PATHS = {
    "a_reconfigure": "reconfigure",
    "a": "new_group",
    "c": "restart",
}


def renamed_cell_key(key: str) -> str:
    """Returns a cell's key with its path's name of now."""
    config, path = key.rsplit("-", 1)
    return f"{config}-{RENAMED_PATHS.get(path, path)}"


def load(path: pathlib.Path) -> dict:
    """Reads the results file at ``path`` (empty where there is none), with the paths' names of now."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data["cells"] = {
        renamed_cell_key(key): cell for key, cell in data.get("cells", {}).items()
    }
    data.setdefault("steady", {})
    data.setdefault("call", {})
    return data


def save(data: dict, path: pathlib.Path) -> None:
    """Writes the results file: what every measurement adds, at once."""
    path.write_text(json.dumps(data, indent=1) + "\n")
