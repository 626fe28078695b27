"""Installing into a stand-in site-packages, and what a failure leaves behind."""

import os
import pathlib
import subprocess
import sys

import pytest

from overlay_fixtures import BASE, FakeBuild, ORIGINALS, site_state
from torch_overlay import install
from torch_overlay.reporting import OverlayError


def test_install_status_uninstall(repo, site, torch_dist, capsys):
    build = FakeBuild()
    install.install(repo, torch_dist, BASE, build, check=FakeBuild.check)
    assert build.calls == 1
    distributed = (site / "torch/nn/parallel/distributed.py").read_text()
    assert "    def _update_process_group(\n" in distributed
    assert (
        "void reset_state();"
        in (site / "torch/include/torch/csrc/distributed/c10d/reducer.hpp").read_text()
    )
    assert (
        site / (install.PACKAGE + ".pth")
    ).read_text() == f"import {install.PACKAGE}\n"
    # Without the .pth file's start-up hook, distributed.py loads the extension itself.
    assert distributed.endswith(install.generate_extension_loader(torch_dist.version))
    assert install.print_status(repo, torch_dist, BASE) == 0

    install.install(repo, torch_dist, BASE, build, check=FakeBuild.check)
    assert build.calls == 1, "an up-to-date install rebuilt"
    assert "already installed and up to date" in capsys.readouterr().out

    install.uninstall(torch_dist)
    for installed, data in ORIGINALS.items():
        assert (site / installed).read_bytes() == data
    assert not (site / install.PACKAGE).exists()
    assert not (site / (install.PACKAGE + ".pth")).exists()
    assert install.print_status(repo, torch_dist, BASE) == 1


def test_a_missing_extension_says_how_to_recover():
    # The package gone, the patched distributed.py still there.
    code = install.generate_extension_loader("2.1.2+cu121").replace(
        install.PACKAGE, "_no_such_overlay_package"
    )
    with pytest.raises(ImportError) as caught:
        exec(compile(code, "distributed.py", "exec"), {})
    message = str(caught.value)
    assert "scripts/overlay install" in message
    assert "pip install --force-reinstall --no-deps torch==2.1.2" in message


def test_the_installed_overlay_loads_without_start_up_hooks(tmp_path):
    # python -S skips the .pth file; DDP must not run on the stock Reducer then.
    try:
        import torch
    except ImportError:
        pytest.skip(
            "torch is not installed in this interpreter: run under scripts/test"
        )
    site = pathlib.Path(torch.__file__).parents[1]
    if not (site / (install.PACKAGE + ".pth")).is_file():
        pytest.skip(
            "the overlay is not installed in this interpreter: run under scripts/test"
        )
    env = dict(os.environ, PYTHONPATH=str(site))
    loaded = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys; assert sys.flags.no_site and '{install.PACKAGE}' not in sys.modules; "
            f"import torch; print('{install.PACKAGE}._C' in sys.modules)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "True"


def test_install_rebuilds_when_patches_change(repo, site, torch_dist):
    build = FakeBuild()
    install.install(repo, torch_dist, BASE, build, check=FakeBuild.check)
    patch = sorted(BASE.patches(repo).glob("*.patch"))[0]
    # Its message: a change that the later patches' hunks do not see.
    patch.write_text(
        patch.read_text().replace(
            "Upstream has it since 2.2", "Upstream has had it since 2.2", 1
        )
    )
    assert install.print_status(repo, torch_dist, BASE) == 2
    install.install(repo, torch_dist, BASE, build, check=FakeBuild.check)
    assert build.calls == 2
    assert install.print_status(repo, torch_dist, BASE) == 0
    install.uninstall(torch_dist)
    for installed, data in ORIGINALS.items():
        assert (site / installed).read_bytes() == data


def test_a_shorter_series_leaves_no_file_patched_that_it_does_not_patch(
    repo, site, torch_dist
):
    # As scripts/mutants and a run at one commit of the stack install one.
    build = FakeBuild()
    install.install(repo, torch_dist, BASE, build, check=FakeBuild.check)
    for patch in sorted(BASE.patches(repo).glob("*.patch"))[1:]:
        patch.unlink()
    install.install(repo, torch_dist, BASE, build, check=FakeBuild.check)
    # The first patch, the backport, changes no communication hook; later ones do.
    hook = "torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py"
    assert (site / hook).read_bytes() == ORIGINALS[hook]
    assert hook not in install.Manifest.read(site).files
    assert install.print_status(repo, torch_dist, BASE) == 0
    install.uninstall(torch_dist)
    for installed, data in ORIGINALS.items():
        assert (site / installed).read_bytes() == data


def test_status_notices_a_file_changed_behind_its_back(repo, site, torch_dist):
    install.install(repo, torch_dist, BASE, FakeBuild(), check=FakeBuild.check)
    with open(site / "torch/nn/parallel/distributed.py", "a") as f:
        f.write("# edited\n")
    assert install.print_status(repo, torch_dist, BASE) == 2


@pytest.mark.parametrize("version", ["2.2.0", "2.0.1"])
def test_install_refuses_other_torch_and_changes_nothing(
    repo, site, torch_dist, version
):
    before = site_state(site)
    torch_dist.version = version
    with pytest.raises(OverlayError, match="upstream|needs torch 2.1.x"):
        install.install(repo, torch_dist, BASE, FakeBuild(), check=FakeBuild.check)
    assert site_state(site) == before


def test_patch_that_does_not_apply_changes_nothing(repo, site, torch_dist):
    before = site_state(site)
    patch = sorted(BASE.patches(repo).glob("*.patch"))[0]
    # Corrupt a context line of the backport's distributed.py hunk.
    text = patch.read_text()
    assert "\n RPC_AVAILABLE = False\n" in text
    patch.write_text(
        text.replace("\n RPC_AVAILABLE = False\n", "\n RPC_AVAILABLE = None\n", 1)
    )
    with pytest.raises(
        OverlayError, match="does not apply to the files of the installed torch"
    ):
        install.install(repo, torch_dist, BASE, FakeBuild(), check=FakeBuild.check)
    assert site_state(site) == before


def test_failed_build_changes_nothing(repo, site, torch_dist):
    before = site_state(site)
    with pytest.raises(OverlayError, match="compiler said no"):
        install.install(
            repo,
            torch_dist,
            BASE,
            FakeBuild(error=OverlayError("compiler said no")),
            check=FakeBuild.check,
        )
    assert site_state(site) == before


def test_modified_torch_is_refused(repo, site, torch_dist):
    with open(site / "torch/nn/parallel/distributed.py", "a") as f:
        f.write("# local change\n")
    before = site_state(site)
    with pytest.raises(
        OverlayError,
        match="differs from the file the torch 2.1.2 wheel installed",
    ):
        install.install(repo, torch_dist, BASE, FakeBuild(), check=FakeBuild.check)
    assert site_state(site) == before


# The scripts
