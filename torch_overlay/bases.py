"""The releases a patch series is kept against, and the torch each overlay patches.

Plain Python: the scripts use it before a venv exists. Each base has its own
series in ``patches/<base>/``:

* ``v2.14.1``, the default: upstream has the API; the series fixes what upstream
  still gets wrong, as a stack that pytorch/pytorch can take. 2.14.1 is the newest
  release that pip installs on this project's machines;
* ``v2.1.2``: adds ``DistributedDataParallel._update_process_group`` to the last
  release without it, for teams that maintain PyTorch 2.1 in their own repository.
"""

import dataclasses
import pathlib
import re
from typing import Dict, List, Optional, Tuple

from torch_overlay import commits

# The release (2.2) from which upstream has DistributedDataParallel._update_process_group.
UPSTREAM_SINCE = (2, 2)
# Where each series adds its test file in a PyTorch tree. This repository keeps each
# base's copy of it in test/distributed/BASE/ (see Base.test_file).
TEST_FILE = "test/distributed/test_ddp_update_process_group.py"


class UnsupportedTorch(Exception):
    """The torch at hand is not the one a base's overlay patches; the message says what to do."""


def parse(version: str) -> Tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)", version)
    if not match:
        raise UnsupportedTorch(f"cannot read a torch version from {version!r}")
    return int(match.group(1)), int(match.group(2))


@dataclasses.dataclass(frozen=True)
class Base:
    """A release that a series is kept against."""

    name: str  # the release's git tag, and the folder of its series under patches/
    torch: str  # the wheel its overlay patches, from PyPI
    # The newest CUDA toolkit the release builds with (its CI's newest).
    newest_cuda: Tuple[int, int]
    # Where a ghstack stack of this series can go, for scripts/submit --help.
    submit_to: str
    # Pins that only this base's venv needs, besides torch itself.
    extra_requirements: Tuple[str, ...] = ()
    # The subject of the last of the patches that the series starts with that fix bugs
    # (the rest extend), and the other releases whose files those fixes apply to and
    # whose libtorch the overlay can carry them onto (scripts/overlay install
    # --fixes-only, scripts/gpu-check). A subject, not a count: the stack may be reordered.
    last_fix: str = ""
    fixes_also_on: Tuple[str, ...] = ()

    @property
    def release(self) -> Tuple[int, int]:
        return parse(self.torch)

    @property
    def has_api(self) -> bool:
        """Whether the release itself has DistributedDataParallel._update_process_group."""
        return self.release >= UPSTREAM_SINCE

    @property
    def requirements(self) -> Tuple[str, ...]:
        return (f"torch=={self.torch}",) + self.extra_requirements

    def patches(self, repo: pathlib.Path) -> pathlib.Path:
        return repo / "patches" / self.name

    def tests(self, repo: pathlib.Path) -> pathlib.Path:
        """Return where ``repo`` keeps the files that this base's series adds under test/distributed/."""
        return repo / "test" / "distributed" / self.name

    def test_file(self, repo: pathlib.Path) -> pathlib.Path:
        """Return this base's copy of :data:`TEST_FILE`, byte for byte what its series adds."""
        return self.repo_path(repo, TEST_FILE)

    def repo_path(self, repo: pathlib.Path, tree_path: str) -> pathlib.Path:
        """Return where ``repo`` keeps the file that the series adds at ``tree_path`` under test/distributed/."""
        prefix = "test/distributed/"
        if not tree_path.startswith(prefix):
            raise ValueError(f"{tree_path} is not under {prefix}")
        return self.tests(repo) / tree_path[len(prefix) :]

    def fix_patches(self, repo: pathlib.Path) -> List[pathlib.Path]:
        """Return the patches that the series starts with that fix bugs, through :attr:`last_fix`."""
        if not self.last_fix:
            raise UnsupportedTorch(f"the {self.name} series marks no patches as fixes")
        try:
            return commits.list_patches_through(self.patches(repo), self.last_fix)
        except commits.UnknownCommit as e:
            raise UnsupportedTorch(f"the {self.name} series' last fix: {e}") from None

    def venv(self, repo: pathlib.Path) -> pathlib.Path:
        """Return the overlay venv of this base: .venv-<base> (.venv-v2.1.2, .venv-v2.14.1), for every
        base alike, so that no name stands for whichever torch the default base has."""
        return repo / f".venv-{self.name}"

    def check_fixes(self, version: str) -> None:
        """Raise UnsupportedTorch unless the fixes alone can be carried onto torch ``version``."""
        if not self.last_fix:
            raise UnsupportedTorch(f"the {self.name} series marks no patches as fixes")
        if parse(version) in [self.release] + [parse(v) for v in self.fixes_also_on]:
            return
        releases = ", ".join(
            f"{v[0]}.{v[1]}.x"
            for v in [self.release] + [parse(v) for v in self.fixes_also_on]
        )
        raise UnsupportedTorch(
            f"the fixes of the {self.name} series (through {self.last_fix!r}) apply to torch "
            f"{releases}, not to torch {version}."
        )

    def check(self, version: str) -> None:
        """Raise UnsupportedTorch unless ``version`` is a release of this base's line (2.1.x for v2.1.2)."""
        found = parse(version)
        if found == self.release:
            return
        other = next((b for b in BASES.values() if b.release == found), None)
        if other is not None:
            hint = f"that is the base {other.name}: pass --base {other.name}"
        elif self.has_api or found < UPSTREAM_SINCE:
            hint = f"install torch=={self.torch}"
        else:
            hint = (
                f"torch {version} has DistributedDataParallel._update_process_group upstream; "
                f"the series with upstream's fixes is --base {LATEST}"
            )
        raise UnsupportedTorch(
            f"torch {version} is not supported by the {self.name} series, which needs torch "
            f"{self.release[0]}.{self.release[1]}.x; {hint}."
        )


BASES: Dict[str, Base] = {
    base.name: base
    for base in (
        Base(
            name="v2.1.2",
            torch="2.1.2",
            newest_cuda=(12, 1),
            submit_to=(
                "a repository your team owns whose default branch is its 2.1 line (PyTorch takes no "
                "features on release branches, and ghstack refuses forks)"
            ),
            # torch 2.1.2 was built against NumPy 1.
            extra_requirements=("numpy<2",),
        ),
        Base(
            name="v2.14.1",
            torch="2.14.1",
            # The CUDA of its default wheel (torch.version.cuda of torch 2.14.1 from PyPI).
            newest_cuda=(13, 0),
            submit_to="pytorch/pytorch, applied onto a checkout of its main branch (or a repository your team owns)",
            # The fixes: the in-flight collectives of an interrupted pass and of one that
            # failed in finalize_backward(), the model check and the bucket assignment, the
            # argument check, distributed_test.py's tests. Their hunks apply to the files
            # of the 2.11.0 wheel, the torch of the GPU machines (scripts/gpu-check).
            last_fix="[DDP] Run the _update_process_group tests of distributed_test.py on Gloo",
            fixes_also_on=("2.11.0",),
            # benchmarks/recovery_after_lost_rank.py runs torchft beside the series; it needs
            # torch 2.7 or later, so the venvs of older bases go without it.
            extra_requirements=("torchft==0.2.0",),
        ),
    )
}
# The series that adds the API, to the last release without it.
ADDS_API = "v2.1.2"
# The newest release with a series.
LATEST = "v2.14.1"
# The base of every script without --base: the current release.
DEFAULT = LATEST
# The overlay's and the scripts' own tests (test/torch_overlay, test/scripts) run in this
# base's venv, on its series: they stand in for its wheel and a release/2.1 checkout. They
# check the overlay and the scripts, not a series, so they run with one base only.
TOOL_TESTS_BASE = ADDS_API


def get(name: Optional[str]) -> Base:
    """Return the base called ``name`` (the default base for None)."""
    try:
        return BASES[name or DEFAULT]
    except KeyError:
        raise UnsupportedTorch(
            f"no series for the base {name!r}; the bases are {', '.join(BASES)}"
        ) from None
