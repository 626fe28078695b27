"""``python -m torch_overlay {install,status,uninstall}``, run by scripts/overlay inside the venv."""

import argparse
import pathlib
import sys

from torch_overlay import bases, install
from torch_overlay.reporting import OverlayError
from torch_overlay.series import SeriesError
from torch_overlay.wheel import Torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_overlay", description=__doc__
    )
    parser.add_argument("action", choices=("install", "status", "uninstall"))
    parser.add_argument(
        "--repo", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1]
    )
    parser.add_argument("--base", choices=tuple(bases.BASES), default=bases.DEFAULT)
    parser.add_argument(
        "--fixes-only",
        action="store_true",
        help="carry only the patches of the series that fix bugs (it starts with them), also onto the "
        "other releases whose files they apply to (install and status)",
    )
    args = parser.parse_args(argv)
    base = bases.get(args.base)
    try:
        torch = Torch.find()
        if args.action == "install":
            install.install(args.repo, torch, base, fixes_only=args.fixes_only)
        elif args.action == "status":
            return install.print_status(
                args.repo, torch, base, fixes_only=args.fixes_only
            )
        else:
            install.uninstall(torch)
    except (OverlayError, SeriesError) as e:
        print(f"overlay {args.action}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
