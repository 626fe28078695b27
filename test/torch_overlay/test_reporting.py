"""torch_overlay.reporting: the overlay's progress lines and its error."""

import pytest

from torch_overlay.reporting import OverlayError, progress


def test_progress_prints_a_line_tagged_overlay(capsys):
    progress("building the extension")
    assert capsys.readouterr() == ("[overlay] building the extension\n", "")


def test_overlay_error_is_an_exception_with_its_message():
    with pytest.raises(Exception) as e:
        raise OverlayError("no torch in this venv")
    assert type(e.value) is OverlayError
    assert str(e.value) == "no torch in this venv"
