"""Shared by the scripts: where things are, the overlay venv, and how to fail and report."""

import hashlib
import os
import pathlib
import subprocess
import sys
from typing import List, NoReturn, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO / ".venv"
# The overlay venv: torch 2.1.2 and the test tools, the linters, and what the benchmarks plot with.
REQUIREMENTS = (
    REPO / "torch_overlay" / "requirements.txt",
    REPO / "requirements-lint.txt",
    REPO / "benchmarks" / "requirements.txt",
)

sys.path.insert(0, str(REPO))
from torch_overlay import versions  # noqa: E402


def progress(message: str) -> None:
    print(f"[{pathlib.Path(sys.argv[0]).name}] {message}", flush=True)


def die(message: str, code: int = 2) -> NoReturn:
    print(f"{pathlib.Path(sys.argv[0]).name}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def add_venv_argument(parser) -> None:
    parser.add_argument(
        "--venv",
        type=pathlib.Path,
        default=DEFAULT_VENV,
        help=f"the overlay virtual environment (default: {DEFAULT_VENV.relative_to(REPO)} at the repo root)",
    )


def venv_python(venv: pathlib.Path) -> pathlib.Path:
    return venv / "bin" / "python"


def venv_env(extra: Optional[dict] = None, venv: pathlib.Path = DEFAULT_VENV) -> dict:
    """The environment for running the venv's tools on this repository's code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [str(venv / "bin"), env.get("PATH")]))
    env.update(extra or {})
    return env


def run(cmd: Sequence[object], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run with every argument (str, Path, ...) turned into a string."""
    return subprocess.run([str(c) for c in cmd], **kwargs)


def installed_torch_version(python: pathlib.Path) -> Optional[str]:
    result = run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() if result.returncode == 0 else None


def requirements() -> List[str]:
    lines = (line.split("#")[0].strip() for f in REQUIREMENTS for line in f.read_text().splitlines())
    return [line for line in lines if line]


def ensure_venv(venv: pathlib.Path) -> pathlib.Path:
    """Create the venv if it is missing and install the requirements; returns its python."""
    python = venv_python(venv)
    if not python.exists():
        progress(f"creating the virtual environment {venv}")
        if run([sys.executable, "-m", "venv", venv]).returncode != 0:
            die(f"could not create a virtual environment at {venv}")
    version = installed_torch_version(python)
    wanted = requirements()
    if version is not None:
        try:
            versions.check(version)
        except versions.UnsupportedTorch as e:
            die(f"{venv}: {e}")
        # Keep the 2.1.x that is there.
        wanted = [r for r in wanted if not r.startswith("torch")]
    stamp_file = venv / ".torch_overlay_requirements"
    stamp = hashlib.sha256("\n".join(wanted).encode()).hexdigest()
    if version is not None and stamp_file.is_file() and stamp_file.read_text() == stamp:
        return python
    if version is None:
        progress("installing torch 2.1.2 (about 700 MB, plus the CUDA runtime packages) and the test tools")
    else:
        progress(f"installing the test tools next to torch {version}")
    if run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", *wanted]).returncode != 0:
        die(f"pip could not install {' '.join(wanted)} into {venv}")
    stamp_file.write_text(stamp)
    return python


def overlay(python: pathlib.Path, action: str) -> int:
    """Run ``python -m torch_overlay ACTION`` for this repository inside the venv."""
    venv = python.parent.parent
    return run([python, "-m", "torch_overlay", action, "--repo", REPO], env=venv_env(venv=venv)).returncode


def ensure_overlay(venv: pathlib.Path) -> pathlib.Path:
    """The venv with the overlay installed and up to date with patches/; returns its python."""
    python = ensure_venv(venv)
    if overlay(python, "install") != 0:
        die("the overlay could not be installed; see above")
    return python
