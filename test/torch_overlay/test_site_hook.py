"""torch_overlay.site_hook: <package>._C loads after torch.nn.parallel.distributed.

Each test runs in a fresh interpreter without site-packages (``-I -S``), so that
neither the real torch nor an installed overlay's hook takes part: the hook is
site_hook.py copied in as a package's ``__init__.py``, as install.py installs it,
next to a fake ``_C`` and a fake torch tree whose
``torch/nn/parallel/distributed.py`` is the trigger; both record their import.
"""

import pathlib
import subprocess
import sys
import textwrap

import torch_overlay

SITE_HOOK = pathlib.Path(torch_overlay.__file__).parent / "site_hook.py"
RECORD = "import record\nrecord.events.append({name!r})\n"


def _run(tmp_path, script):
    """Return the output lines of ``script``, run in an isolated interpreter."""
    (tmp_path / "record.py").write_text("events = []\n")
    hook = tmp_path / "overlay_hook"
    hook.mkdir()
    (hook / "__init__.py").write_text(SITE_HOOK.read_text())
    (hook / "_C.py").write_text(RECORD.format(name="overlay_hook._C"))
    parallel = tmp_path / "torch/nn/parallel"
    parallel.mkdir(parents=True)
    for package in ("torch", "torch/nn", "torch/nn/parallel"):
        (tmp_path / package / "__init__.py").write_text("")
    (parallel / "distributed.py").write_text(
        RECORD.format(name="torch.nn.parallel.distributed")
    )
    prelude = (
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport record\n"
        "def finders():\n"
        "    return sum(\n"
        "        type(f).__name__ == '_LoadAfterDistributed' for f in sys.meta_path\n"
        "    )\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_c_is_loaded_only_once_the_trigger_module_is_imported(tmp_path):
    script = """
        import overlay_hook
        print(finders(), record.events)
        import torch.nn.parallel
        print(finders(), record.events)
        import torch.nn.parallel.distributed
        print(finders(), record.events)
    """
    assert _run(tmp_path, script) == [
        "1 []",
        "1 []",
        # The trigger runs first, then _C; the finder has done its work and is gone.
        "0 ['torch.nn.parallel.distributed', 'overlay_hook._C']",
    ]


def test_installing_again_adds_no_second_finder(tmp_path):
    script = """
        import overlay_hook
        overlay_hook._install()
        overlay_hook._install()
        print(finders(), record.events)
        import torch.nn.parallel.distributed
        print(finders(), record.events)
    """
    assert _run(tmp_path, script) == [
        "1 []",
        "0 ['torch.nn.parallel.distributed', 'overlay_hook._C']",
    ]


def test_c_is_loaded_at_once_when_the_trigger_module_is_already_imported(tmp_path):
    script = """
        import torch.nn.parallel.distributed
        import overlay_hook
        print(finders(), record.events)
    """
    assert _run(tmp_path, script) == [
        "0 ['torch.nn.parallel.distributed', 'overlay_hook._C']"
    ]
