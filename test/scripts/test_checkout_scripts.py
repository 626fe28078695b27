"""scripts/apply, build and submit, run as a user would, against a stand-in PyTorch checkout."""

import email.parser
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import (
    BASE,
    fake_command,
    git,
    GIT,
    load_helper,
    load_script,
    PATCHES,
    REPO,
    USER,
)
from torch_overlay import bases

_checkout = load_helper("_checkout")


def _header(patch: pathlib.Path, field: str) -> str:
    # Drop format-patch's "From <sha>" separator line.
    headers = email.parser.Parser().parsestr(
        patch.read_text().split("\n", 1)[1], headersonly=True
    )
    return " ".join(headers[field].split())


def _subject(patch: pathlib.Path) -> str:
    # Drop format-patch's "[PATCH n/m] " prefix.
    return _header(patch, "Subject").split("] ", 1)[1]


SUBJECTS = [_subject(p) for p in sorted(PATCHES.glob("*.patch"))]


# git am records a committer; do not depend on the machine's git configuration.
COMMITTER = {"GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com"}
SERIES_AUTHOR = "DDP update_process_group maintainers"
AUTHOR_ENV = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE")


def _set_by_the_test(name):
    # The author comes from the checkout's config (conftest.USER), and scripts/build's
    # settings from its defaults, unless a test sets them.
    return (
        name in AUTHOR_ENV
        or name.startswith(("USE_", "BUILD_", "CMAKE_"))
        or name == "MAX_JOBS"
    )


def script(name, *args, env=None):
    """Runs scripts/NAME, on the series of the stand-in checkout's base unless ``args`` name one."""
    inherited = {k: v for k, v in os.environ.items() if not _set_by_the_test(k)}
    args = tuple(map(str, args))
    base = () if "--base" in args else ("--base", BASE.name)
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *args, *base],
        capture_output=True,
        text=True,
        env={**inherited, **COMMITTER, **(env or {})},
    )


def head(tree):
    return (
        git(tree, "rev-parse", "HEAD").strip(),
        git(tree, "rev-parse", "--abbrev-ref", "HEAD").strip(),
    )


def branches(tree):
    return git(tree, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()


# scripts/apply


def test_check_reports_and_changes_nothing(pytorch_tree):
    before = head(pytorch_tree)
    result = script("apply", pytorch_tree, "--check")
    assert result.returncode == 0, result.stderr
    assert (
        f"the {len(SUBJECTS)} patches of the v2.1.2 series apply cleanly to HEAD (version 2.1.0a0)"
        in result.stdout
    )
    assert result.stderr == ""
    assert head(pytorch_tree) == before and branches(pytorch_tree) == ["main"]


def test_check_on_a_dirty_tree_warns_that_apply_would_refuse(pytorch_tree):
    with open(pytorch_tree / "setup.py", "a") as f:
        f.write("# local edit\n")
    result = script("apply", pytorch_tree, "--check")
    assert result.returncode == 0, result.stderr
    assert "apply cleanly to HEAD" in result.stdout
    assert (
        "apply: warning: " in result.stderr
        and "has uncommitted changes" in result.stderr
    )
    assert (
        "without --check would refuse" in result.stderr
        and "M setup.py" in result.stderr
    )


@pytest.mark.parametrize("done", [5, len(SUBJECTS) - 1])
def test_apply_finishes_a_partly_applied_series(pytorch_tree, done):
    patches = sorted((REPO / "patches" / "v2.1.2").glob("*.patch"))
    git(pytorch_tree, "am", "-q", "--keep-non-patch", *map(str, patches[:done]))
    check = script("apply", pytorch_tree, "--check")
    assert check.returncode == 0, check.stderr
    held = f"HEAD already holds the first {done} of the {len(patches)} patches of the v2.1.2 series"
    assert held in check.stdout
    assert (
        f"the {len(patches) - done} remaining patches of the v2.1.2 series apply cleanly"
        in check.stdout
    )
    result = script("apply", pytorch_tree)
    assert result.returncode == 0, result.stderr
    assert (
        held in result.stdout
        and f"({patches[0].name} to {patches[done - 1].name})" in result.stdout
    )
    assert (
        git(
            pytorch_tree, "log", "--format=%s", f"-{len(SUBJECTS)}", "--reverse"
        ).splitlines()
        == SUBJECTS
    )
    assert "already applied at HEAD" in script("apply", pytorch_tree, "--check").stdout


def test_check_warns_that_the_branch_exists(pytorch_tree):
    git(pytorch_tree, "branch", "ddp-update-process-group")
    result = script("apply", pytorch_tree, "--check")
    assert result.returncode == 0, result.stderr
    assert "apply cleanly to HEAD" in result.stdout
    assert (
        "apply: warning: scripts/apply without --check would stop: branch ddp-update-process-group already "
        "exists; pass --branch NAME"
    ) in result.stderr
    assert script("apply", pytorch_tree, "--check", "--branch", "other").stderr == ""
    result = script("apply", pytorch_tree)
    assert (
        result.returncode == 2
        and "branch ddp-update-process-group already exists" in result.stderr
    )


def test_apply_makes_the_series_commits_on_a_branch(pytorch_tree):
    result = script("apply", pytorch_tree)
    assert result.returncode == 0, result.stderr
    assert "applied: " in result.stdout
    assert (
        git(pytorch_tree, "rev-parse", "--abbrev-ref", "HEAD").strip()
        == "ddp-update-process-group"
    )
    log = git(
        pytorch_tree, "log", "--format=%s|%an", f"-{len(SUBJECTS)}", "--reverse"
    ).splitlines()
    assert [line.split("|")[0] for line in log] == SUBJECTS
    assert all(line.endswith(f"|{USER[0]}") for line in log)
    assert (
        "void Reducer::reset_state() {"
        in (pytorch_tree / "torch/csrc/distributed/c10d/reducer.cpp").read_text()
    )
    assert (
        pytorch_tree / "test/distributed/test_ddp_update_process_group.py"
    ).is_file()


def series_log(tree, branch, fields):
    return git(
        tree, "log", "--reverse", f"--format={fields}", f"main..{branch}"
    ).splitlines()


def test_apply_makes_the_commits_yours_unless_keep_author(pytorch_tree):
    result = script("apply", pytorch_tree)
    assert result.returncode == 0, result.stderr
    assert f"author: {USER[0]} <{USER[1]}>\n" in result.stdout
    branch = "ddp-update-process-group"
    assert series_log(pytorch_tree, branch, "%an <%ae>|%cn <%ce>") == [
        f"{USER[0]} <{USER[1]}>|Test <test@example.com>"
    ] * len(SUBJECTS)
    git(pytorch_tree, "switch", "-q", "main")
    result = script("apply", pytorch_tree, "--keep-author", "--branch", "kept")
    assert result.returncode == 0, result.stderr
    assert "(the series' own, --keep-author)" in result.stdout
    kept = series_log(pytorch_tree, "kept", "%an <%ae>|%aD")
    assert len(kept) == len(SUBJECTS)
    assert all(
        line.startswith(f"{SERIES_AUTHOR} <") and "noreply" in line for line in kept
    )
    assert [line.split("|")[1] for line in kept] == [
        _header(p, "Date") for p in sorted(PATCHES.glob("*.patch"))
    ]
    # Only the authorship differs: the same messages, "[c10d]" subjects and all, and the same trees.
    messages = git(
        pytorch_tree, "log", "--reverse", "--format=%B%x00", f"main..{branch}"
    )
    assert messages == git(
        pytorch_tree, "log", "--reverse", "--format=%B%x00", "main..kept"
    )
    assert series_log(pytorch_tree, branch, "%T") == series_log(
        pytorch_tree, "kept", "%T"
    )


def test_apply_author_from_the_environment_wins(pytorch_tree):
    env = {"GIT_AUTHOR_NAME": "Env Person", "GIT_AUTHOR_EMAIL": "env@example.com"}
    result = script("apply", pytorch_tree, env=env)
    assert result.returncode == 0, result.stderr
    authors = series_log(pytorch_tree, "ddp-update-process-group", "%an <%ae>")
    assert authors == ["Env Person <env@example.com>"] * len(SUBJECTS)


def test_apply_leaves_the_checkout_as_it_was_when_the_author_cannot_be_reset(
    pytorch_tree,
):
    hook = pytorch_tree / ".git" / "hooks" / "pre-rebase"
    hook.write_text("#!/bin/sh\necho no rebasing here >&2\nexit 1\n")
    hook.chmod(0o755)
    before = head(pytorch_tree)
    result = script("apply", pytorch_tree)
    assert result.returncode == 2
    assert (
        "could not make the applied commits yours" in result.stderr
        and "no rebasing here" in result.stderr
    )
    assert "back on main, as it was" in result.stderr
    # Not a conflict: no advice on resolving one.
    assert "three-way merge" not in result.stderr
    assert head(pytorch_tree) == before and branches(pytorch_tree) == ["main"]
    assert git(pytorch_tree, "status", "--porcelain") == ""
    assert not (pytorch_tree / ".git" / "rebase-merge").exists()
    assert script("apply", pytorch_tree, "--keep-author").returncode == 0


def test_apply_twice_says_already_applied(pytorch_tree):
    assert script("apply", pytorch_tree).returncode == 0
    before = head(pytorch_tree)
    result = script("apply", pytorch_tree, "--branch", "again")
    assert result.returncode == 0, result.stderr
    assert "already applied" in result.stdout
    assert head(pytorch_tree) == before and "again" not in branches(pytorch_tree)
    assert "already applied" in script("apply", pytorch_tree, "--check").stdout


def test_dirty_tree_is_refused(pytorch_tree):
    with open(pytorch_tree / "setup.py", "a") as f:
        f.write("# local edit\n")
    result = script("apply", pytorch_tree)
    assert result.returncode == 2
    assert "has uncommitted changes; commit or stash them first" in result.stderr
    assert branches(pytorch_tree) == ["main"]


def commit_a_conflict(tree):
    # A line that the series changes too: even a three-way merge cannot reconcile them. It
    # is in join.py, which the Join commit is the first to change, so that the merge has the
    # file's blob from before that commit (the stand-ins of reducer.cpp and init.cpp have no
    # blob of the real files, and a local change to distributed.py none of its later ones).
    join = tree / "torch/distributed/algorithms/join.py"
    enter = "    def __enter__(self):\n        ...\n"
    join.write_text(join.read_text().replace(enter, enter.replace("...", "pass"), 1))
    git(tree, "commit", "-qam", "a local change where the series changes the file")


def assert_names_the_conflict(stderr):
    # The Join commit's place in the series changes as commits are added before it.
    assert re.search(
        r"\d{4}-DDP-Refuse-_update_process_group-inside-a-Join-conte\.patch does not apply",
        stderr,
    )
    assert (
        "the hunk at torch/distributed/algorithms/join.py:226 does not match" in stderr
    )
    assert (
        "CONFLICT (content): Merge conflict in torch/distributed/algorithms/join.py"
        in stderr
    )
    # scripts/apply has aborted: git am's advice on going on is not for the user.
    for hint in (
        'run "git am --continue"',
        "git am --skip",
        "git am --abort",
        "git am --show-current-patch",
    ):
        assert hint not in stderr


def test_conflict_aborts_cleanly_and_names_the_hunk(pytorch_tree):
    commit_a_conflict(pytorch_tree)
    before = head(pytorch_tree)
    result = script("apply", pytorch_tree)
    assert result.returncode == 2
    assert_names_the_conflict(result.stderr)
    assert "back on main, as it was" in result.stderr
    # The next step: the series by hand, with a three-way merge.
    series = REPO / "patches" / "v2.1.2"
    assert (
        f"  cd {pytorch_tree} && git switch -c ddp-update-process-group\n"
        in result.stderr
    )
    assert f"  git am --3way --keep-non-patch {series}/*.patch\n" in result.stderr
    assert (
        "edit torch/distributed/algorithms/join.py to keep both changes"
        in result.stderr
    )
    assert (
        "  git rebase --exec 'git commit --amend --no-edit" in result.stderr
        and f" {before[0]}\n" in result.stderr
    )
    assert f"scripts/submit {pytorch_tree} --base v2.1.2 --dry-run" in result.stderr
    assert head(pytorch_tree) == before and branches(pytorch_tree) == ["main"]
    assert git(pytorch_tree, "status", "--porcelain") == ""
    assert not (pytorch_tree / ".git" / "rebase-apply").exists()
    check = script("apply", pytorch_tree, "--check")
    assert (
        check.returncode == 2
        and "the hunk at torch/distributed/algorithms/join.py:226" in check.stderr
    )
    assert head(pytorch_tree) == before and branches(pytorch_tree) == ["main"]
    assert git(pytorch_tree, "worktree", "list").count("\n") == 1


def test_conflict_on_a_detached_head_returns_to_it(pytorch_tree):
    # As after `git checkout v2.1.2`.
    commit_a_conflict(pytorch_tree)
    git(pytorch_tree, "switch", "-q", "--detach")
    sha = git(pytorch_tree, "rev-parse", "HEAD").strip()
    result = script("apply", pytorch_tree)
    assert result.returncode == 2
    assert_names_the_conflict(result.stderr)
    assert f"back at {sha[:12]} (a detached HEAD), as it was" in result.stderr
    assert head(pytorch_tree) == (sha, "HEAD") and branches(pytorch_tree) == ["main"]
    assert git(pytorch_tree, "status", "--porcelain") == ""


def test_untracked_file_in_the_way_is_named(pytorch_tree):
    created = "test/distributed/test_ddp_update_process_group.py"
    (pytorch_tree / created).parent.mkdir(parents=True, exist_ok=True)
    (pytorch_tree / created).write_text("my own draft\n")
    before = head(pytorch_tree)
    result = script("apply", pytorch_tree)
    assert result.returncode == 2
    assert (
        "has untracked files in the way of files that the series creates"
        in result.stderr
    )
    assert f"\n  {created}\n" in result.stderr + "\n"
    assert "hunk" not in result.stderr
    assert head(pytorch_tree) == before and branches(pytorch_tree) == ["main"]
    assert (pytorch_tree / created).read_text() == "my own draft\n"
    check = script("apply", pytorch_tree, "--check")
    assert check.returncode == 0, check.stderr
    assert "apply cleanly to HEAD" in check.stdout
    assert (
        "apply: warning: scripts/apply without --check would stop" in check.stderr
        and created in check.stderr
    )
    # An ignored file is not in the way: git overwrites it.
    (pytorch_tree / ".git" / "info" / "exclude").write_text(created + "\n")
    assert script("apply", pytorch_tree).returncode == 0


def test_not_a_pytorch_tree(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "is not a git checkout" in script("apply", plain).stderr
    subprocess.run(GIT + ["init", "-q", str(plain)], check=True)
    result = script("apply", plain)
    assert result.returncode == 2
    assert (
        "is not a PyTorch source tree: it has no setup.py, version.txt" in result.stderr
    )


def test_already_upstream(pytorch_tree):
    ddp = pytorch_tree / "torch/nn/parallel/distributed.py"
    ddp.write_text(
        ddp.read_text()
        + "\n    def _update_process_group(self, new_process_group):\n        pass\n"
    )
    (pytorch_tree / "version.txt").write_text("2.2.0a0\n")
    git(pytorch_tree, "commit", "-qam", "upstream has it")
    result = script("apply", pytorch_tree)
    assert result.returncode == 0, result.stderr
    assert "is already upstream in this tree (version 2.2.0a0)" in result.stdout
    assert "the v2.1.2 series adds it to 2.1.x and is not needed" in result.stdout
    assert f"--base {bases.LATEST}" in result.stdout
    assert branches(pytorch_tree) == ["main"]


def test_apply_takes_the_base(pytorch_tree):
    result = script("apply", pytorch_tree, "--check", "--base", "v2.14.1")
    # The upstream series may not be written yet; either way, this 2.1 tree is not for it.
    assert result.returncode == 2
    assert (
        "no patches in " in result.stderr
        or f"the series that adds it is --base {bases.ADDS_API}" in result.stderr
    )
    result = script("apply", pytorch_tree, "--base", "v1.0")
    assert (
        result.returncode == 2
        and "no series for the base 'v1.0'; the bases are v2.1.2, v2.14.1"
        in result.stderr
    )


API = "\n    def _update_process_group(self, new_process_group):\n        pass\n"


@pytest.mark.parametrize(
    "base, version, api, state",
    [
        ("v2.1.2", "2.1.0a0", False, "base"),
        ("v2.1.2", "2.1.2", False, "base"),
        ("v2.1.2", "2.12.0a0", True, "upstream"),
        ("v2.14.1", "2.14.1", True, "base"),
        ("v2.14.1", "2.14.2", True, "base"),
        ("v2.14.1", "2.15.0a0", True, "base"),
    ],
)
def test_tree_state(base, version, api, state):
    assert (
        _checkout.classify_tree(bases.get(base), version, API if api else "") == state
    )


@pytest.mark.parametrize(
    "base, version, api, error",
    [
        ("v2.1.2", "2.0.1", False, "needs torch 2.1.x"),
        ("v2.14.1", "2.13.0", True, "version 2.13.0 is older than v2.14.1"),
        (
            "v2.14.1",
            "2.1.0a0",
            False,
            "has no DistributedDataParallel._update_process_group of its own",
        ),
        ("v2.14.1", "2.1.0a0", False, f"--base {bases.ADDS_API}"),
    ],
)
def test_tree_state_refuses(base, version, api, error):
    with pytest.raises(_checkout.CheckoutError, match=error.replace(".", r"\.")):
        _checkout.classify_tree(bases.get(base), version, API if api else "")


def test_state_with_the_api_upstream(pytorch_tree, tmp_path):
    # A main checkout after v2.14.1, and a one-patch stand-in for the upstream series.
    ddp = pytorch_tree / _checkout.DDP
    ddp.write_text(ddp.read_text() + API)
    (pytorch_tree / "version.txt").write_text("2.15.0a0\n")
    git(pytorch_tree, "commit", "-qam", "main after v2.14.1")
    ddp.write_text(ddp.read_text().replace("        pass\n", "        return None\n"))
    git(pytorch_tree, "commit", "-qam", "[DDP] a fix")
    patches = [
        pathlib.Path(p)
        for p in git(
            pytorch_tree, "format-patch", "-1", "-o", str(tmp_path / "series")
        ).split()
    ]
    tree = _checkout.Checkout.open(pytorch_tree)
    upstream = bases.get("v2.14.1")
    assert tree.read_state(upstream, patches) == "applied"
    git(pytorch_tree, "reset", "-q", "--hard", "HEAD~1")
    assert tree.read_state(upstream, patches) == "base"
    assert tree.read_state(BASE, _checkout.list_patch_files(BASE)) == "upstream"
    (pytorch_tree / "version.txt").write_text("2.13.0\n")
    git(pytorch_tree, "commit", "-qam", "an older release")
    with pytest.raises(
        _checkout.CheckoutError,
        match=f"{pytorch_tree}: version 2.13.0 is older than v2.14.1",
    ):
        tree.read_state(upstream, patches)


def test_other_release_is_refused(pytorch_tree):
    (pytorch_tree / "version.txt").write_text("2.0.1\n")
    git(pytorch_tree, "commit", "-qam", "2.0")
    result = script("apply", pytorch_tree, "--check")
    assert result.returncode == 2 and "needs torch 2.1.x" in result.stderr


# scripts/build


def fake_nvcc(bin_dir, release):
    return fake_command(
        bin_dir,
        "nvcc",
        f"echo 'Cuda compilation tools, release {release}, V{release}.1'",
    )


def dry_run_env(tmp_path, *tools, **settings):
    bin_dir = tmp_path / "bin"
    for name in tools:
        fake_command(bin_dir, name)
    path = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    return {"PATH": path, "CUDA_HOME": "", "CUDA_PATH": "", **settings}


def test_build_dry_run_cpu(pytorch_tree, tmp_path):
    result = script(
        "build", pytorch_tree, "--dry-run", "--jobs", "2", env=dry_run_env(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "CUDA toolkit: none found, building for CPU (Gloo only)" in lines
    assert f"cd {pytorch_tree}" in lines
    assert (
        f"env USE_DISTRIBUTED=1 USE_GLOO=1 USE_CUDA=0 USE_NCCL=0 MAX_JOBS=2 BUILD_TEST=0 {sys.executable} setup.py develop"
        in lines
    )
    assert "scripts/apply --base v2.1.2 applies it" in result.stdout


def test_build_dry_run_cuda_ccache_tests(pytorch_tree, tmp_path):
    assert script("apply", pytorch_tree).returncode == 0
    nvcc = fake_nvcc(tmp_path / "bin", "12.1")
    env = dry_run_env(tmp_path, "ccache")
    result = script(
        "build", pytorch_tree, "--dry-run", "--with-tests", "--jobs", "7", env=env
    )
    assert result.returncode == 0, result.stderr
    assert f"CUDA toolkit: {nvcc} (CUDA 12.1)\n" in result.stdout
    assert (
        "USE_CUDA=1 USE_NCCL=1 MAX_JOBS=7 BUILD_TEST=1 CMAKE_C_COMPILER_LAUNCHER=ccache"
        in result.stdout
    )
    assert (
        "CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache"
        in result.stdout
    )
    assert "not applied" not in result.stdout


def env_line(stdout):
    return next(line for line in stdout.splitlines() if line.startswith("env "))


def test_build_user_settings_win(pytorch_tree, tmp_path):
    fake_nvcc(tmp_path / "bin", "12.1")
    settings = {
        "USE_CUDA": "0",
        "MAX_JOBS": "3",
        "BUILD_TEST": "1",
        "CMAKE_BUILD_TYPE": "RelWithDebInfo",
    }
    result = script(
        "build",
        pytorch_tree,
        "--dry-run",
        env=dry_run_env(tmp_path, "ccache", **settings),
    )
    assert result.returncode == 0, result.stderr
    assert (
        "CUDA: not used (USE_CUDA=0 from your environment), building for CPU (Gloo only)"
        in result.stdout
    )
    assert "USE_CUDA=0 USE_NCCL=0 MAX_JOBS=3 BUILD_TEST=1 " in env_line(result.stdout)
    assert "CMAKE_C_COMPILER_LAUNCHER=ccache" in env_line(result.stdout)
    assert "CMAKE_BUILD_TYPE=RelWithDebInfo" in env_line(result.stdout)
    from_user = next(
        line
        for line in result.stdout.splitlines()
        if line.startswith("from your environment")
    )
    assert sorted(from_user.split(": ", 1)[1].split()) == sorted(
        f"{k}={v}" for k, v in settings.items()
    )
    # The command line is more explicit than the environment.
    result = script(
        "build",
        pytorch_tree,
        "--dry-run",
        "--jobs",
        "5",
        env=dry_run_env(tmp_path, MAX_JOBS="3"),
    )
    assert (
        "MAX_JOBS=5" in env_line(result.stdout)
        and "from your environment" not in result.stdout
    )


def test_build_user_can_keep_nccl_off_with_cuda(pytorch_tree, tmp_path):
    fake_nvcc(tmp_path / "bin", "12.1")
    result = script(
        "build", pytorch_tree, "--dry-run", env=dry_run_env(tmp_path, USE_NCCL="0")
    )
    assert result.returncode == 0, result.stderr
    assert " USE_CUDA=1 USE_NCCL=0 " in env_line(result.stdout)


def test_build_does_not_use_a_cuda_newer_than_the_base_builds_with(
    pytorch_tree, tmp_path
):
    nvcc = fake_nvcc(tmp_path / "bin", "12.4")
    result = script("build", pytorch_tree, "--dry-run", env=dry_run_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (
        f"CUDA toolkit: {nvcc} is CUDA 12.4, newer than CUDA 12.1, the newest that PyTorch 2.1 (v2.1.2) builds with; "
        "not using it, building for CPU (Gloo only)"
    ) in result.stdout
    assert (
        "point CUDA_HOME at a CUDA 12.1 or older toolkit (CUDA_HOME=/usr/local/cuda-12.1 scripts/build"
        in (result.stdout)
    )
    assert " USE_CUDA=0 USE_NCCL=0 " in env_line(result.stdout)
    # A supported toolkit under CUDA_HOME comes before the one on PATH.
    home = tmp_path / "cuda-12.1"
    supported = fake_nvcc(home / "bin", "12.1")
    result = script(
        "build",
        pytorch_tree,
        "--dry-run",
        env={**dry_run_env(tmp_path), "CUDA_HOME": str(home)},
    )
    assert f"CUDA toolkit: {supported} (CUDA 12.1)\n" in result.stdout
    assert " USE_CUDA=1 USE_NCCL=1 " in env_line(result.stdout)


def test_build_refuses_use_cuda_with_a_toolkit_too_new(pytorch_tree, tmp_path):
    fake_nvcc(tmp_path / "bin", "12.4")
    result = script(
        "build", pytorch_tree, "--dry-run", env=dry_run_env(tmp_path, USE_CUDA="1")
    )
    assert result.returncode == 2
    assert "build: error: USE_CUDA=1 is set, but the CUDA toolkit at " in result.stderr
    assert (
        "is CUDA 12.4, newer than CUDA 12.1" in result.stderr
        and "CUDA_HOME=/usr/local/cuda-12.1" in result.stderr
    )
    assert "env " not in result.stdout


def test_build_refuses_a_cuda_home_without_a_toolkit(pytorch_tree, tmp_path):
    missing = tmp_path / "cuda-12.1"
    result = script(
        "build",
        pytorch_tree,
        "--dry-run",
        env=dry_run_env(tmp_path, CUDA_HOME=str(missing)),
    )
    assert result.returncode == 2
    assert (
        f"CUDA_HOME={missing} does not exist: point it at a CUDA toolkit, or unset it"
        in result.stderr
    )


def test_build_dry_run_says_what_would_fail(pytorch_tree, tmp_path):
    # An empty submodule, as a clone without --recursive leaves it.
    module = tmp_path / "gloo"
    subprocess.run(GIT + ["init", "-q", str(module)], check=True)
    git(module, "commit", "-q", "--allow-empty", "-m", "gloo")
    git(
        pytorch_tree,
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "add",
        "-q",
        str(module),
        "third_party/gloo",
    )
    git(pytorch_tree, "commit", "-qm", "gloo")
    git(pytorch_tree, "submodule", "deinit", "-q", "-f", "third_party/gloo")
    # An interpreter without PyYAML, which setup.py imports.
    python = fake_command(
        tmp_path / "fake", "python", 'case "$2" in *find_spec*) echo yaml ;; esac'
    )
    result = script(
        "build",
        pytorch_tree,
        "--dry-run",
        "--python",
        python,
        env=dry_run_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert (
        "build: warning: the build would fail: submodules not checked out (third_party/gloo): run git -C "
        f"{pytorch_tree} submodule update --init --recursive"
    ) in result.stderr
    assert (
        f"{python} cannot import yaml, which setup.py needs: run {python} -m pip install -r"
        in result.stderr
    )
    result = script(
        "build", pytorch_tree, "--python", python, env=dry_run_env(tmp_path)
    )
    assert (
        result.returncode == 2
        and "the build would fail:\n  submodules not checked out" in result.stderr
    )
    # Checked out, then moved to another commit than the one recorded.
    git(
        pytorch_tree,
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "update",
        "-q",
        "--init",
    )
    git(module, "commit", "-q", "--allow-empty", "-m", "newer")
    git(
        pytorch_tree / "third_party" / "gloo",
        "-c",
        "protocol.file.allow=always",
        "pull",
        "-q",
        str(module),
    )
    result = script("build", pytorch_tree, "--dry-run", env=dry_run_env(tmp_path))
    assert (
        "submodules at other commits than the checkout records (third_party/gloo)"
        in result.stderr
    )


def test_build_dry_run_says_when_cmake_is_missing(pytorch_tree, tmp_path):
    # A PATH with git alone: no cmake, no cmake3.
    only_git = tmp_path / "only-git"
    only_git.mkdir()
    (only_git / "git").symlink_to(shutil.which("git"))
    result = script(
        "build",
        pytorch_tree,
        "--dry-run",
        env={**dry_run_env(tmp_path), "PATH": str(only_git)},
    )
    assert result.returncode == 0, result.stderr
    assert "the build would fail: neither cmake nor cmake3 is on PATH" in result.stderr
    # cmake3 alone does, as PyTorch's build takes it.
    fake_command(tmp_path / "cmake3-bin", "cmake3")
    path = os.pathsep.join([str(only_git), str(tmp_path / "cmake3-bin")])
    assert (
        "cmake"
        not in script(
            "build",
            pytorch_tree,
            "--dry-run",
            env={**dry_run_env(tmp_path), "PATH": path},
        ).stderr
    )


def test_build_refuses_a_non_pytorch_tree(tmp_path):
    result = script("build", tmp_path, "--dry-run")
    assert result.returncode == 2 and "is not a git checkout" in result.stderr


# scripts/submit

GITHUB = "https://github.com/our-team/pytorch.git"


@pytest.fixture
def published(pytorch_tree, tmp_path):
    """pytorch_tree, cloned from a bare remote, origin, whose default branch is main; origin's
    push URL is on GitHub, as ghstack reads it, and it fetches from the local bare repository.
    """
    remote = tmp_path / "remote.git"
    subprocess.run(
        GIT + ["clone", "-q", "--bare", str(pytorch_tree), str(remote)], check=True
    )
    git(pytorch_tree, "remote", "add", "origin", str(remote))
    git(pytorch_tree, "fetch", "-q", "origin")
    git(pytorch_tree, "remote", "set-head", "origin", "main")
    git(pytorch_tree, "remote", "set-url", "--push", "origin", GITHUB)
    return pytorch_tree


@pytest.fixture
def submit_env(tmp_path):
    """A fake ghstack that records its arguments and directory, a fake gh that says whether a
    repository is a fork (FAKE_GH_FORK), and a home without a .ghstackrc."""
    bin_dir = tmp_path / "submit-bin"
    log = tmp_path / "ghstack.log"
    fake_command(
        bin_dir,
        "ghstack",
        f'pwd > {log}\nfor arg in "$@"; do echo "$arg" >> {log}; done',
    )
    fake_command(
        bin_dir, "gh", f'echo "$@" > {tmp_path / "gh.log"}\necho "$FAKE_GH_FORK"'
    )
    (tmp_path / "home").mkdir()
    path = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    return {
        "PATH": path,
        "HOME": str(tmp_path / "home"),
        "GHSTACKRC_PATH": "",
        "FAKE_GH_FORK": "false",
    }


def ghstack_call(tmp_path):
    """(directory, arguments) of the fake ghstack's run, or None."""
    log = tmp_path / "ghstack.log"
    if not log.exists():
        return None
    cwd, *argv = log.read_text().splitlines()
    return cwd, argv


def commit_file(tree, name, message):
    (tree / name).write_text(f"{message}\n")
    git(tree, "add", name)
    git(tree, "commit", "-qm", message)
    return git(tree, "rev-parse", "HEAD").strip()


def test_submit_dry_run_prints_the_command_and_the_stack(
    published, submit_env, tmp_path
):
    assert script("apply", published).returncode == 0
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert (
        f"ghstack would submit the {len(SUBJECTS)} commits on ddp-update-process-group in {published} that are "
        "not on origin/main (git rev-list HEAD ^origin/main), oldest first:"
    ) in out
    commits = [
        line
        for line in out.splitlines()
        if line.startswith("  ") and not line.startswith("      ")
    ]
    listed = [line.split(" ", 3)[3] for line in commits]
    assert listed == SUBJECTS
    assert "      torch/csrc/distributed/c10d/reducer.cpp" in out
    assert "      test/distributed/test_ddp_update_process_group.py" in out
    assert (
        f"command: cd {shlex.quote(str(published))} && ghstack submit --base main\n"
        in out
    )
    assert out.rstrip().endswith("dry run: nothing submitted")
    assert (tmp_path / "gh.log").read_text().split() == [
        "api",
        "repos/our-team/pytorch",
        "--jq",
        ".fork",
    ]
    assert ghstack_call(tmp_path) is None


def test_submit_runs_ghstack_in_the_checkout(published, submit_env, tmp_path):
    assert script("apply", published).returncode == 0
    result = script("submit", published, env=submit_env)
    assert result.returncode == 0, result.stderr
    assert "[submit] running ghstack submit --base main in " in result.stdout
    assert ghstack_call(tmp_path) == (str(published), ["submit", "--base", "main"])


def test_submit_refuses_commits_that_are_not_the_series(published, submit_env):
    # Release-only commits between origin/main and the series, and one on top of it.
    below = commit_file(published, "release-note.txt", "a release-only fix")
    assert script("apply", published).returncode == 0
    above = commit_file(published, "extra.txt", "something else")
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 2
    what = f"the {len(SUBJECTS) + 2} commits that ghstack would submit (git rev-list HEAD ^origin/main)"
    assert what in result.stderr
    assert (
        "are not exactly the v2.1.2 series:\n  commits that are not in the series:\n"
        in result.stderr
    )
    assert (
        f"    {below[:12]} a release-only fix\n    {above[:12]} something else\n"
        in result.stderr
    )
    assert "patches that no commit holds" not in result.stderr
    assert (
        "on top of origin/main: run scripts/apply --base v2.1.2 on a checkout of origin/main"
        in result.stderr
    )


def test_submit_names_the_missing_patches(published, submit_env):
    assert script("apply", published).returncode == 0
    git(published, "reset", "-q", "--hard", "HEAD~2")
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 2
    missing = "".join(f"    {p.name}\n" for p in sorted(PATCHES.glob("*.patch"))[-2:])
    assert f"  patches that no commit holds:\n{missing}" in result.stderr
    assert "commits that are not in the series" not in result.stderr


def test_submit_refuses_a_branch_without_the_series(published, submit_env):
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 2
    assert "the 0 commits that ghstack would submit" in result.stderr
    assert all(p.name in result.stderr for p in PATCHES.glob("*.patch"))


def push(tree, branch):
    """Push to origin's bare repository (its push URL is GitHub's) and fetch it back."""
    git(tree, "push", "-q", git(tree, "remote", "get-url", "origin").strip(), branch)
    git(tree, "fetch", "-q", "origin")


def test_submit_refuses_the_series_on_a_tree_it_is_not_for(published, submit_env):
    # Upstream's API, where no hunk of the series looks: among the module's helpers.
    ddp = published / _checkout.DDP
    api = API.lstrip("\n").replace("    ", "", 1)
    ddp.write_text(
        ddp.read_text().replace(
            "\ndef _find_tensors(", f"\n{api}\n\ndef _find_tensors(", 1
        )
    )
    git(published, "commit", "-qam", "upstream has it")
    push(published, "main")
    # scripts/apply says the series is not needed here; git am applies it all the same.
    subprocess.run(
        GIT
        + [
            "-C",
            str(published),
            "am",
            "-q",
            *map(str, sorted(PATCHES.glob("*.patch"))),
        ],
        check=True,
    )
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 2
    assert (
        "origin/main (version 2.1.0a0) already has DistributedDataParallel._update_process_group"
        in result.stderr
    )
    assert f"--base {bases.LATEST}" in result.stderr


def test_submit_follows_the_remote_default_branch(published, submit_env):
    # The team's 2.1 line is the default branch of its repository; main lacks its fix.
    git(published, "switch", "-q", "-c", "team-2.1")
    fix = commit_file(published, "team-fix.txt", "the team's fix")
    push(published, "team-2.1")
    git(published, "remote", "set-head", "origin", "team-2.1")
    assert script("apply", published).returncode == 0
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 0, result.stderr
    assert "(git rev-list HEAD ^origin/team-2.1)" in result.stdout
    assert "ghstack submit --base team-2.1\n" in result.stdout
    # Without a recorded default branch, ghstack's would be main, which lacks the fix.
    git(published, "remote", "set-head", "origin", "--delete")
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 2
    assert (
        "(git rev-list HEAD ^origin/main)" in result.stderr
        and f"    {fix[:12]} the team's fix\n" in result.stderr
    )


def test_submit_refuses_a_fork(published, submit_env, tmp_path):
    assert script("apply", published).returncode == 0
    result = script("submit", published, env={**submit_env, "FAKE_GH_FORK": "true"})
    assert result.returncode == 2
    assert (
        'origin is our-team/pytorch on GitHub, a fork, and ghstack refuses it: "Cowardly refusing to upload diffs '
        'to a repository that is a fork"'
    ) in result.stderr
    assert "so it needs write access to that repository itself" in result.stderr
    assert BASE.submit_to in result.stderr
    assert ghstack_call(tmp_path) is None


def test_submit_warns_that_it_cannot_check_for_a_fork_without_gh(
    published, submit_env, tmp_path
):
    assert script("apply", published).returncode == 0
    (tmp_path / "submit-bin" / "gh").unlink()
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 0, result.stderr
    assert (
        "submit: warning: could not check whether our-team/pytorch (origin) is a fork: the GitHub CLI, gh, "
        "is not on PATH"
    ) in result.stderr


def test_submit_uses_the_remote_that_ghstack_uses(published, submit_env, tmp_path):
    assert script("apply", published).returncode == 0
    rc = tmp_path / "home" / ".ghstackrc"
    rc.write_text("[ghstack]\nremote_name = upstream\n")
    result = script(
        "submit", published, "--dry-run", "--remote", "origin", env=submit_env
    )
    assert result.returncode == 2
    assert (
        f"ghstack would submit to the remote upstream (remote_name in {rc}), not origin"
        in result.stderr
    )
    result = script("submit", published, "--dry-run", env=submit_env)
    assert (
        result.returncode == 2
        and "has no remote upstream, which ghstack submits to" in result.stderr
    )
    git(published, "remote", "rename", "origin", "upstream")
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 0, result.stderr
    assert "(git rev-list HEAD ^upstream/main)" in result.stdout


def test_submit_help_says_where_each_series_goes():
    out = script("submit", "--help").stdout
    for base in bases.BASES.values():
        assert f"  {base.name}: " in out
        assert " ".join(base.submit_to.split()) in " ".join(out.split())


def test_submit_without_ghstack_says_how_to_get_it(published, submit_env, tmp_path):
    assert script("apply", published).returncode == 0
    (tmp_path / "submit-bin" / "ghstack").unlink()
    result = script("submit", published, env=submit_env)
    assert result.returncode == 2 and "ghstack is not installed" in result.stderr


def test_submit_dry_run_says_that_ghstack_is_missing(published, submit_env, tmp_path):
    assert script("apply", published).returncode == 0
    (tmp_path / "submit-bin" / "ghstack").unlink()
    result = script("submit", published, "--dry-run", env=submit_env)
    assert result.returncode == 0, result.stderr
    assert (
        "submit: warning: ghstack is not installed (pip install ghstack, then set up ~/.ghstackrc): the run "
        "without --dry-run stops there"
    ) in result.stderr
    assert result.stdout.rstrip().endswith("dry run: nothing submitted")


@pytest.mark.parametrize("dry_run", [True, False])
def test_submit_refuses_the_release_series_for_pytorch(
    published, submit_env, tmp_path, dry_run
):
    assert script("apply", published).returncode == 0
    git(
        published,
        "remote",
        "set-url",
        "--push",
        "origin",
        "git@github.com:pytorch/pytorch.git",
    )
    result = script(
        "submit", published, *(["--dry-run"] if dry_run else []), env=submit_env
    )
    assert result.returncode == 2
    assert (
        f"origin is pytorch/pytorch on GitHub, and the {BASE.name} series never goes there: it is for a release "
        "line, and PyTorch takes no features on release branches."
    ) in result.stderr
    assert ghstack_call(tmp_path) is None


# scripts/test --torch-src


def test_torch_src_dry_run_lists_the_runs(pytorch_tree):
    result = script("test", "--torch-src", pytorch_tree, "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert (
        "# ours, source build\n(out=$(mktemp -d) && " in out
        and str(REPO / "test" / "distributed") in out
    )
    assert (
        "# upstream test_c10d_gloo.py\n(out=$(mktemp -d) && " in out
        and f" && cd {pytorch_tree} && " in out
    )
    # release/2.1's run_test.py runs Gloo with 3 ranks on a machine without 2 GPUs.
    assert "# upstream DDP cases, gloo, world size 3\n(out=$(mktemp -d) && " in out
    assert "BACKEND=gloo WORLD_SIZE=3 INIT_METHOD=env://" in out
    assert "-k 'ddp or DistributedDataParallel'" in out
    assert "NCCL: 0 GPU(s) visible, fewer than 2" in out


def test_torch_src_dry_run_commands_run_as_printed(pytorch_tree, tmp_path):
    # -k reaches every printed command; this one selects no test, so the paste runs fast.
    result = script(
        "test",
        "--torch-src",
        pytorch_tree,
        "--dry-run",
        "--python",
        sys.executable,
        "-k",
        "no_such_case",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    ours = lines[lines.index("# ours, source build") + 1]
    assert "-k no_such_case" in ours
    assert "-k '(ddp or DistributedDataParallel) and (no_such_case)'" in result.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pasted = subprocess.run(
        ["bash", "-c", ours], cwd=elsewhere, capture_output=True, text=True
    )
    out = pasted.stdout + pasted.stderr
    # pytest's own status, 5: it ran, and the -k selected nothing.
    assert (
        pasted.returncode == 5 and "deselected" in out and "error" not in out.lower()
    ), out
    results = pathlib.Path(out.split("results: ")[1].split()[0])
    assert (results / "junit.xml").is_file()
    assert list(elsewhere.iterdir()) == [] and not (pytorch_tree / "junit.xml").exists()


def test_torch_src_refuses_a_tree_of_another_base_as_build_does(pytorch_tree):
    tested = script(
        "test", "--torch-src", pytorch_tree, "--base", "v2.14.1", "--dry-run"
    )
    built = script("build", pytorch_tree, "--base", "v2.14.1", "--dry-run")
    assert tested.returncode == built.returncode == 2
    assert tested.stderr.split(": ", 1)[1] == built.stderr.split(": ", 1)[1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dry-run"], "--dry-run only goes with --torch-src"),
        (["--python", "python3"], "--python only goes with --torch-src"),
        (["--upstream", "-k", "x"], "--upstream runs its own selection of tests"),
        (
            ["--each-commit", "test/scripts"],
            "--each-commit runs its own selection of tests",
        ),
        (["--torch-src", ".", "test/scripts"], "--torch-src runs its own suites"),
        (["--through", "x"], "--through only goes with --each-commit"),
        (
            ["--stock", "--new-tests-only"],
            "--new-tests-only only goes with --each-commit",
        ),
    ],
)
def test_options_that_a_mode_would_ignore_are_refused(args, message):
    result = script("test", *args)
    assert result.returncode == 2 and message in result.stderr


def test_torch_src_needs_a_build_of_that_checkout(pytorch_tree):
    result = script("test", "--torch-src", pytorch_tree)
    assert result.returncode == 2
    assert f"is not the develop build of {pytorch_tree}" in result.stderr


def source_build_python(tmp_path, tree, answer):
    """An interpreter that imports ``tree``'s torch, sees no GPU, and answers one more query: ``answer``,
    a case of a shell ``case`` statement on its -c code."""
    return fake_command(
        tmp_path / "bin",
        "python",
        f'case "$2" in *torch.__file__*) echo {tree}/torch/__init__.py ;; *device_count*) echo 0 ;; {answer} esac',
    )


def test_torch_src_needs_the_test_tools(pytorch_tree, tmp_path):
    # An interpreter that imports the checkout's torch, but not pytest-rerunfailures.
    python = source_build_python(
        tmp_path, pytorch_tree, "*find_spec*) echo pytest_rerunfailures ;;"
    )
    result = script("test", "--torch-src", pytorch_tree, "--python", python)
    assert result.returncode == 2
    assert (
        f"{python} cannot import pytest_rerunfailures, which the tests run with"
        in result.stderr
    )


def test_torch_src_names_the_pytest_that_collects_the_tests(pytorch_tree, tmp_path):
    # release/2.1's MultiProcessTestCase cannot be collected by pytest 8. Its CI pins 7.3.2;
    # the pin is read from the checkout, which here says another.
    (pytorch_tree / ".ci" / "docker").mkdir(parents=True)
    (pytorch_tree / ".ci" / "docker" / "requirements-ci.txt").write_text(
        "pytest==7.2.1\n#Description: x\n"
    )
    python = source_build_python(
        tmp_path, pytorch_tree, "*pytest.__version__*) echo 8.3.5 ;;"
    )
    result = script("test", "--torch-src", pytorch_tree, "--python", python)
    assert result.returncode == 2
    assert (
        f"{python} has pytest 8.3.5, which cannot collect the tests against v2.1.2's source"
        in result.stderr
    )
    assert "-m pip install pytest==7.2.1" in result.stderr
    result = script(
        "test", "--torch-src", pytorch_tree, "--python", python, "--dry-run"
    )
    assert (
        result.returncode == 0
        and "test: warning: the runs would not collect: " in result.stderr
    )


def test_torch_src_needs_a_pytorch_tree(tmp_path):
    result = script("test", "--torch-src", tmp_path, "--dry-run")
    assert result.returncode == 2 and "is not a git checkout" in result.stderr


def test_a_commit_is_its_patch_whatever_the_context(tmp_path):
    # The v2.14.1 series' .cpp diffs carry whole functions as context, which git patch-id
    # counts; what a commit removes and adds is what scripts/submit compares.
    submit = load_script("submit")
    tree = tmp_path / "tree"
    subprocess.run(GIT + ["init", "-q", str(tree)], check=True)
    body = "".join(f"  step_{n}();\n" for n in range(20))
    (tree / "f.cpp").write_text(f"void f() {{\n{body}}}\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "base")
    (tree / "f.cpp").write_text(
        f"void f() {{\n{body.replace('step_10', 'changed_10')}}}\n"
    )
    git(tree, "commit", "-qam", "[c10d] Change f")
    shown = git(tree, "show", "--format=", "HEAD")
    whole = git(
        tree,
        "format-patch",
        "--stdout",
        "--no-signature",
        "--function-context",
        "-1",
        "HEAD",
    )
    ids = [
        subprocess.run(
            ["git", "patch-id", "--stable"], input=text, capture_output=True, text=True
        ).stdout.split()[0]
        for text in (shown, whole)
    ]
    assert ids[0] != ids[1]
    assert submit.compute_change_id(shown) == submit.compute_change_id(whole)
    other = git(
        tree, "format-patch", "--stdout", "--no-signature", "-1", "HEAD"
    ).replace("changed_10", "changed_11")
    assert submit.compute_change_id(other) != submit.compute_change_id(shown)
