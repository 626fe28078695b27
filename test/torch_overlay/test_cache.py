"""torch_overlay.cache: XDG_CACHE_HOME moves the overlay's cache, as it moves others."""

import pathlib

from torch_overlay import cache


def test_xdg_cache_home_moves_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.locate_cache() == tmp_path / "torch_overlay"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.locate_cache() == pathlib.Path.home() / ".cache" / "torch_overlay"
