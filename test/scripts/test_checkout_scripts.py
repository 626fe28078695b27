"""scripts/apply, build and submit, run as a user would, against a stand-in PyTorch checkout."""

import email.parser
import os
import pathlib
import subprocess
import sys

from conftest import git, GIT, PATCHES, REPO, USER


def _header(patch: pathlib.Path, field: str) -> str:
    # Drop format-patch's "From <sha>" separator line.
    headers = email.parser.Parser().parsestr(patch.read_text().split("\n", 1)[1], headersonly=True)
    return " ".join(headers[field].split())


def _subject(patch: pathlib.Path) -> str:
    # Drop format-patch's "[PATCH n/m] " prefix.
    return _header(patch, "Subject").split("] ", 1)[1]


SUBJECTS = [_subject(p) for p in sorted(PATCHES.glob("*.patch"))]


# git am records a committer; do not depend on the machine's git configuration.
COMMITTER = {"GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com"}
SERIES_AUTHOR = "DDP update_process_group maintainers"
AUTHOR_ENV = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE")


def script(name, *args, env=None):
    # The author comes from the checkout's config (conftest.USER) unless a test sets it.
    inherited = {k: v for k, v in os.environ.items() if k not in AUTHOR_ENV}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *map(str, args)],
        capture_output=True,
        text=True,
        env={**inherited, **COMMITTER, **(env or {})},
    )


def head(tree):
    return git(tree, "rev-parse", "HEAD").strip(), git(tree, "rev-parse", "--abbrev-ref", "HEAD").strip()


def branches(tree):
    return git(tree, "branch", "--format=%(refname:short)").split()


# scripts/apply


def test_check_reports_and_changes_nothing(pytorch_tree):
    before = head(pytorch_tree)
    result = script("apply", pytorch_tree, "--check")
    assert result.returncode == 0, result.stderr
    assert f"the {len(SUBJECTS)} patches apply cleanly to HEAD (version 2.1.0a0)" in result.stdout
    assert head(pytorch_tree) == before and branches(pytorch_tree) == ["main"]


def test_apply_makes_the_series_commits_on_a_branch(pytorch_tree):
    result = script("apply", pytorch_tree)
    assert result.returncode == 0, result.stderr
    assert "applied: " in result.stdout
    assert git(pytorch_tree, "rev-parse", "--abbrev-ref", "HEAD").strip() == "ddp-update-process-group"
    log = git(pytorch_tree, "log", "--format=%s|%an", f"-{len(SUBJECTS)}", "--reverse").splitlines()
    assert [line.split("|")[0] for line in log] == SUBJECTS
    assert all(line.endswith(f"|{USER[0]}") for line in log)
    assert "bool Reducer::reset_state() {" in (pytorch_tree / "torch/csrc/distributed/c10d/reducer.cpp").read_text()
    assert (pytorch_tree / "test/distributed/test_ddp_update_process_group.py").is_file()


def series_log(tree, branch, fields):
    return git(tree, "log", "--reverse", f"--format={fields}", f"main..{branch}").splitlines()


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
    assert all(line.startswith(f"{SERIES_AUTHOR} <") and "noreply" in line for line in kept)
    assert [line.split("|")[1] for line in kept] == [_header(p, "Date") for p in sorted(PATCHES.glob("*.patch"))]
    # Only the authorship differs: the same messages, "[c10d]" subjects and all, and the same trees.
    messages = git(pytorch_tree, "log", "--reverse", "--format=%B%x00", f"main..{branch}")
    assert messages == git(pytorch_tree, "log", "--reverse", "--format=%B%x00", "main..kept")
    assert series_log(pytorch_tree, branch, "%T") == series_log(pytorch_tree, "kept", "%T")


def test_apply_author_from_the_environment_wins(pytorch_tree):
    env = {"GIT_AUTHOR_NAME": "Env Person", "GIT_AUTHOR_EMAIL": "env@example.com"}
    result = script("apply", pytorch_tree, env=env)
    assert result.returncode == 0, result.stderr
    authors = series_log(pytorch_tree, "ddp-update-process-group", "%an <%ae>")
    assert authors == ["Env Person <env@example.com>"] * len(SUBJECTS)


def test_apply_leaves_the_checkout_as_it_was_when_the_author_cannot_be_reset(pytorch_tree):
    hook = pytorch_tree / ".git" / "hooks" / "pre-rebase"
    hook.write_text("#!/bin/sh\necho no rebasing here >&2\nexit 1\n")
    hook.chmod(0o755)
    before = head(pytorch_tree)
    result = script("apply", pytorch_tree)
    assert result.returncode == 2
    assert "could not make the applied commits yours" in result.stderr and "no rebasing here" in result.stderr
    assert "back on main, as it was" in result.stderr
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


def test_conflict_aborts_cleanly_and_names_the_hunk(pytorch_tree):
    # A line that the series changes too: even a three-way merge cannot reconcile them.
    ddp = pytorch_tree / "torch/nn/parallel/distributed.py"
    line = "    from torch.distributed.distributed_c10d import _get_default_group, ReduceOp\n"
    ddp.write_text(ddp.read_text().replace(line, line.replace("ReduceOp", "ReduceOp, Work"), 1))
    git(pytorch_tree, "commit", "-qam", "a local change where the series changes the file")
    before = head(pytorch_tree)
    result = script("apply", pytorch_tree)
    assert result.returncode == 2
    assert "0002-DDP-Add-DistributedDataParallel._update_process_grou.patch does not apply" in result.stderr
    assert "the hunk at torch/nn/parallel/distributed.py:22 does not match" in result.stderr
    assert "back on main, as it was" in result.stderr
    assert head(pytorch_tree) == before and branches(pytorch_tree) == ["main"]
    assert git(pytorch_tree, "status", "--porcelain") == ""
    assert not (pytorch_tree / ".git" / "rebase-apply").exists()
    check = script("apply", pytorch_tree, "--check")
    assert check.returncode == 2 and "the hunk at torch/nn/parallel/distributed.py:22" in check.stderr
    assert head(pytorch_tree) == before and branches(pytorch_tree) == ["main"]
    assert git(pytorch_tree, "worktree", "list").count("\n") == 1


def test_not_a_pytorch_tree(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "is not a git checkout" in script("apply", plain).stderr
    subprocess.run(GIT + ["init", "-q", str(plain)], check=True)
    result = script("apply", plain)
    assert result.returncode == 2
    assert "is not a PyTorch source tree: it has no setup.py, version.txt" in result.stderr


def test_already_upstream(pytorch_tree):
    ddp = pytorch_tree / "torch/nn/parallel/distributed.py"
    ddp.write_text(ddp.read_text() + "\n    def _update_process_group(self, new_process_group):\n        pass\n")
    (pytorch_tree / "version.txt").write_text("2.2.0a0\n")
    git(pytorch_tree, "commit", "-qam", "upstream has it")
    result = script("apply", pytorch_tree)
    assert result.returncode == 0, result.stderr
    assert "is already upstream in this tree (version 2.2.0a0)" in result.stdout
    assert branches(pytorch_tree) == ["main"]


def test_other_release_is_refused(pytorch_tree):
    (pytorch_tree / "version.txt").write_text("2.0.1\n")
    git(pytorch_tree, "commit", "-qam", "2.0")
    result = script("apply", pytorch_tree, "--check")
    assert result.returncode == 2 and "needs torch 2.1.x" in result.stderr


# scripts/build


def fake_tools(tmp_path, *names):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def dry_run_env(tmp_path, *tools):
    path = os.pathsep.join([str(fake_tools(tmp_path, *tools)), "/usr/bin", "/bin"])
    return {"PATH": path, "CUDA_HOME": "", "CUDA_PATH": ""}


def test_build_dry_run_cpu(pytorch_tree, tmp_path):
    result = script("build", pytorch_tree, "--dry-run", "--jobs", "2", env=dry_run_env(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "CUDA toolkit: none found, building for CPU (Gloo only)" in lines
    assert f"cd {pytorch_tree}" in lines
    assert (
        f"env USE_DISTRIBUTED=1 USE_GLOO=1 USE_CUDA=0 USE_NCCL=0 MAX_JOBS=2 BUILD_TEST=0 {sys.executable} setup.py develop"
        in lines
    )
    assert "scripts/apply applies it" in result.stdout


def test_build_dry_run_cuda_ccache_tests(pytorch_tree, tmp_path):
    assert script("apply", pytorch_tree).returncode == 0
    result = script("build", pytorch_tree, "--dry-run", "--with-tests", "--jobs", "7", env=dry_run_env(tmp_path, "nvcc", "ccache"))
    assert result.returncode == 0, result.stderr
    assert f"CUDA toolkit: {tmp_path / 'bin' / 'nvcc'}" in result.stdout
    assert "USE_CUDA=1 USE_NCCL=1 MAX_JOBS=7 BUILD_TEST=1 CMAKE_C_COMPILER_LAUNCHER=ccache" in result.stdout
    assert "CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache" in result.stdout
    assert "not applied" not in result.stdout


def test_build_refuses_a_non_pytorch_tree(tmp_path):
    result = script("build", tmp_path, "--dry-run")
    assert result.returncode == 2 and "is not a git checkout" in result.stderr


# scripts/submit


def test_submit_dry_run_lists_the_stack(pytorch_tree):
    assert script("apply", pytorch_tree).returncode == 0
    result = script("submit", pytorch_tree, "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{len(SUBJECTS)} commits on ddp-update-process-group" in out
    for subject in SUBJECTS:
        assert subject in out
    assert "      torch/csrc/distributed/c10d/reducer.cpp" in out
    assert "      test/distributed/test_ddp_update_process_group.py" in out
    assert out.rstrip().endswith("dry run: nothing submitted")


def test_submit_refuses_a_branch_with_more_than_the_series(pytorch_tree):
    assert script("apply", pytorch_tree).returncode == 0
    (pytorch_tree / "extra.txt").write_text("extra\n")
    git(pytorch_tree, "add", "extra.txt")
    git(pytorch_tree, "commit", "-qm", "something else")
    result = script("submit", pytorch_tree, "--dry-run")
    assert result.returncode == 2
    assert "the branch must hold exactly the series" in result.stderr


def test_submit_refuses_a_branch_without_the_series(pytorch_tree):
    result = script("submit", pytorch_tree, "--dry-run")
    assert result.returncode == 2


def test_submit_without_ghstack_says_how_to_get_it(pytorch_tree, tmp_path):
    assert script("apply", pytorch_tree).returncode == 0
    path = os.pathsep.join([str(pathlib.Path(sys.executable).parent), "/usr/bin", "/bin"])
    result = script("submit", pytorch_tree, env={"PATH": path})
    assert result.returncode == 2 and "ghstack is not installed" in result.stderr


# scripts/test --torch-src


def test_torch_src_dry_run_lists_the_runs(pytorch_tree):
    result = script("test", "--torch-src", pytorch_tree, "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ours, source build: (cd " in out and str(REPO / "test" / "distributed") in out
    assert f"upstream test_c10d_gloo.py: (cd {pytorch_tree} && " in out
    assert "upstream DDP cases, gloo: (cd" in out
    assert "BACKEND=gloo WORLD_SIZE=2 INIT_METHOD=env://" in out
    assert "-k ddp or DistributedDataParallel" in out
    assert "NCCL: no GPUs (0 visible)" in out


def test_torch_src_needs_a_build_of_that_checkout(pytorch_tree):
    result = script("test", "--torch-src", pytorch_tree)
    assert result.returncode == 2
    assert f"is not the develop build of {pytorch_tree}" in result.stderr


def test_torch_src_needs_a_pytorch_tree(tmp_path):
    result = script("test", "--torch-src", tmp_path, "--dry-run")
    assert result.returncode == 2 and "is not a git checkout" in result.stderr
