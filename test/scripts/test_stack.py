"""scripts/_stack.py: the test file at each commit of a series, for --each-commit."""

import subprocess

from conftest import load_helper

_stack = load_helper("_stack")


def make_series(tmp_path):
    """Two patches: one that changes a torch file only, then one that adds the test file."""
    tree = tmp_path / "tree"
    tree.mkdir()

    def git(*args):
        subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.name", "t")
    git("config", "user.email", "t@example.com")
    (tree / "torch").mkdir()
    (tree / "torch" / "x.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    (tree / "torch" / "x.py").write_text("x = 2\n")
    git("commit", "-qam", "the backport")
    (tree / "test" / "distributed").mkdir(parents=True)
    (tree / "test" / "distributed" / "test_ddp_update_process_group.py").write_text(
        "def test_it():\n    pass\n"
    )
    git("add", "-A")
    git("commit", "-q", "-m", "the test file")
    git("format-patch", "-q", "HEAD~2", "-o", str(tmp_path / "series"))
    return sorted((tmp_path / "series").glob("*.patch"))


def test_no_test_file_before_the_commit_that_adds_it(tmp_path):
    first, second = make_series(tmp_path)
    assert _stack.write_test_file([first], tmp_path / "at1") is None
    test_file = _stack.write_test_file([first, second], tmp_path / "at2")
    assert test_file.read_text() == "def test_it():\n    pass\n"
    # Its ranks start as in the suites.
    conftest = test_file.parent / "conftest.py"
    assert conftest.read_text() == _stack.CONFTEST.read_text()
