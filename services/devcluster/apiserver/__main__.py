"""``python -m services.devcluster.apiserver --state-dir DIR [--port N] [--state-file F]``

Writes ``DIR/kubeconfig`` and prints one JSON line ``{"url": ..., "kubeconfig": ...}`` on
stdout once it answers requests; runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from shared import service

from .schema import DEFAULT_SCHEMA_VERSION
from .server import ApiServer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m services.devcluster.apiserver", description="development Kubernetes API server"
    )
    p.add_argument("--state-dir", required=True, help="directory for the kubeconfig (created if missing)")
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free port)")
    p.add_argument("--state-file", help="JSON file the state is loaded from and saved to")
    p.add_argument("--history-size", type=int, default=1000, help="watch events kept per resource")
    p.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds between watch bookmarks")
    p.add_argument(
        "--field-validation",
        default="Strict",
        choices=("Strict", "Warn", "Ignore"),
        help="fieldValidation when a request names none (the real apiserver's default is Warn)",
    )
    p.add_argument(
        "--schema-version", default=DEFAULT_SCHEMA_VERSION, help="kubernetes-validate schema version"
    )
    p.add_argument("--log-level", default=os.environ.get("DRANET_LOG_LEVEL", "INFO"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    async def run(stop: asyncio.Event) -> None:
        api = ApiServer(
            args.state_dir,
            port=args.port,
            state_file=args.state_file,
            history_size=args.history_size,
            bookmark_interval=args.bookmark_interval,
            default_field_validation=args.field_validation,
            schema_version=args.schema_version,
        )
        async with api:
            sys.stdout.write(json.dumps({"url": api.url, "kubeconfig": api.kubeconfig_path}) + "\n")
            sys.stdout.flush()
            await stop.wait()

    service.run("devcluster-apiserver", args.log_level, run)


if __name__ == "__main__":
    main()
