"""``python -m dev.cluster up``: run dranet on this host against the
development control plane (the README's first command)."""

from __future__ import annotations

import argparse
import sys

from dev.cluster import up


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.cluster", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    up.add_arguments(
        sub.add_parser("up", help="run the driver's services and the control plane until Ctrl-C")
    )
    args = p.parse_args(argv)
    if args.command == "up":
        return up.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
