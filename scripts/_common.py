"""Shared by the scripts: where things are, the overlay venv, and how to fail and report."""

import hashlib
import importlib.util
import os
import pathlib
import subprocess
import sys
from typing import List, NoReturn, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
# The scripts' own folder, where they import their helpers from.
SCRIPTS = pathlib.Path(__file__).resolve().parent
# The overlay venv of each base, .venv-BASE: the base's torch (torch_overlay/bases.py) and
# the test tools, the linters, and what the benchmarks plot with.
REQUIREMENTS = (
    REPO / "torch_overlay" / "requirements.txt",
    REPO / "requirements-lint.txt",
    REPO / "benchmarks" / "requirements.txt",
)
# The project's own Python (torch_overlay, benchmarks), which ensure_venv installs into each
# venv, in place: what the venv imports of it is this checkout's files.
PYPROJECT = REPO / "pyproject.toml"


def load_package(name: str) -> None:
    """Import this checkout's package ``name`` from its folder, unless it is imported already.

    The scripts run on the system python3, which makes the venvs and has not got the package
    installed: they load it from the checkout they are part of.
    """
    if name in sys.modules:
        return
    folder = REPO / name
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


load_package("torch_overlay")
from torch_overlay import bases  # noqa: E402


def progress(message: str) -> None:
    print(f"[{pathlib.Path(sys.argv[0]).name}] {message}", flush=True)


def die(message: str, code: int = 2) -> NoReturn:
    print(
        f"{pathlib.Path(sys.argv[0]).name}: error: {message}",
        file=sys.stderr,
        flush=True,
    )
    sys.exit(code)


def print_warning(message: str) -> None:
    """Say what die() says, as a warning that does not stop the script."""
    print(
        f"{pathlib.Path(sys.argv[0]).name}: warning: {message}",
        file=sys.stderr,
        flush=True,
    )


def add_base_argument(
    parser, default: str = bases.DEFAULT, help: str = "the release whose series to use"
) -> None:
    parser.add_argument(
        "--base",
        type=parse_base,
        default=bases.get(default),
        metavar="BASE",
        help=f"{help}: {', '.join(bases.BASES)} (default: {default})",
    )


def parse_base(name: str) -> bases.Base:
    """Return the base called ``name``: the argparse type of --base."""
    import argparse

    try:
        return bases.get(name)
    except bases.UnsupportedTorch as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# Where the overlay venv of the default base was before every venv was named after its base.
OLD_VENV = REPO / ".venv"


def find_default_venv(base: bases.Base) -> pathlib.Path:
    return base.venv(REPO)


def add_venv_argument(parser) -> None:
    """Add --venv and --base; resolve the venv with :func:`choose_venv` after parsing."""
    add_base_argument(parser)
    parser.add_argument(
        "--venv",
        type=pathlib.Path,
        default=None,
        help=(
            "the overlay virtual environment, whose torch must be the base's (default: "
            f".venv-BASE at the repo root, e.g. {find_default_venv(bases.get(None)).relative_to(REPO)})"
        ),
    )


def choose_venv(args) -> pathlib.Path:
    return args.venv if args.venv is not None else find_default_venv(args.base)


def find_venv_python(venv: pathlib.Path) -> pathlib.Path:
    return venv / "bin" / "python"


def make_venv_env(extra: Optional[dict] = None, *, venv: pathlib.Path) -> dict:
    """Return the environment for running the venv's tools on this repository's code, which
    ensure_venv installed into the venv."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(filter(None, [str(venv / "bin"), env.get("PATH")]))
    env.update(extra or {})
    return env


def run(cmd: Sequence[object], **kwargs) -> subprocess.CompletedProcess:
    """Run subprocess.run with every argument (str, Path, ...) turned into a string."""
    return subprocess.run([str(c) for c in cmd], **kwargs)


def read_torch_version(python: pathlib.Path) -> Optional[str]:
    result = run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() if result.returncode == 0 else None


def list_requirements(base: bases.Base) -> List[str]:
    lines = (
        line.split("#")[0].strip()
        for f in REQUIREMENTS
        for line in f.read_text().splitlines()
    )
    return list(base.requirements) + [line for line in lines if line]


def describe_old_venv(venv: pathlib.Path, old: pathlib.Path = OLD_VENV) -> str:
    """Return what to say where ``venv`` is about to be made and ``old`` is still there: the
    unnumbered venv of a checkout from before the venvs were named after their bases."""
    if not find_venv_python(old).exists() or venv == old:
        return ""
    return (
        f"{old} is not used any more: each base has its own venv, .venv-BASE. Creating {venv}; "
        f"remove {old} once you no longer need it"
    )


def ensure_venv(venv: pathlib.Path, base: bases.Base) -> pathlib.Path:
    """Create the venv if it is missing, install ``base``'s requirements and this checkout's
    package into it, and return its python."""
    python = find_venv_python(venv)
    if not python.exists():
        note = describe_old_venv(venv)
        if note:
            print_warning(note)
        progress(f"creating the virtual environment {venv}")
        if run([sys.executable, "-m", "venv", venv]).returncode != 0:
            die(f"could not create a virtual environment at {venv}")
    version = read_torch_version(python)
    wanted = list_requirements(base)
    if version is not None:
        try:
            base.check(version)
        except bases.UnsupportedTorch as e:
            die(f"{venv}: {e}")
        # Keep the release of the base's line that is there.
        wanted = [r for r in wanted if not r.startswith("torch=")]
    # And this checkout's package, in place: a venv that another checkout installed its own into
    # (--venv), or that has an older pyproject.toml, is installed into again.
    wanted += ["-e", str(REPO)]
    stamp_file = venv / ".torch_overlay_requirements"
    stamp = hashlib.sha256(
        "\n".join(wanted + [PYPROJECT.read_text()]).encode()
    ).hexdigest()
    if version is not None and stamp_file.is_file() and stamp_file.read_text() == stamp:
        return python
    if version is None:
        progress(
            f"installing torch {base.torch} (with its CUDA packages, about 5 GB for 2.1.2), the test tools and {REPO}"
        )
    else:
        progress(f"installing the test tools and {REPO} next to torch {version}")
    if (
        run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                *wanted,
            ]
        ).returncode
        != 0
    ):
        die(f"pip could not install {' '.join(wanted)} into {venv}")
    stamp_file.write_text(stamp)
    return python


def make_overlay_command(
    python: pathlib.Path, action: str, base: bases.Base, repo: pathlib.Path = REPO
) -> List[object]:
    """Return ``python -m torch_overlay ACTION`` for ``base``'s series in ``repo``."""
    return [python, "-m", "torch_overlay", action, "--repo", repo, "--base", base.name]


def run_overlay(python: pathlib.Path, action: str, base: bases.Base) -> int:
    """Run ``python -m torch_overlay ACTION`` for this repository and ``base`` inside the venv."""
    return run(
        make_overlay_command(python, action, base),
        env=make_venv_env(venv=python.parent.parent),
    ).returncode


def ensure_overlay(venv: pathlib.Path, base: bases.Base) -> pathlib.Path:
    """Make sure the venv has ``base``'s overlay, up to date with its series; return its python."""
    python = ensure_venv(venv, base)
    if run_overlay(python, "install", base) != 0:
        die("the overlay could not be installed; see above")
    return python
