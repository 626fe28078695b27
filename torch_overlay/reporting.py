"""How the overlay reports: its error, and its progress lines."""


class OverlayError(Exception):
    """The overlay cannot be installed or removed; the message says why and what to do."""


def progress(message: str) -> None:
    """Print a progress line of the overlay."""
    print(f"[overlay] {message}", flush=True)
