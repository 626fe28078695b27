"""Where the overlay keeps what it built and what it found in a wheel, to do neither twice."""

import os
import pathlib


def locate_cache() -> pathlib.Path:
    """Return the overlay's cache directory: built extensions, and what binutils found.

    ``XDG_CACHE_HOME`` moves it, as it does other caches.
    """
    return (
        pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
        / "torch_overlay"
    )
