"""``python -m services.devcluster.controlplane``: the API server double and the
allocator (the scheduler's DRA part and the claim controller) in one process.

Prints one JSON line ``{"url": ..., "kubeconfig": ...}`` once both run, then
serves until SIGTERM. Used by ``make up``; tests run the pieces in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from kubernetes_asyncio import client, config

from services.devcluster.allocator import AllocatorController
from services.devcluster.apiserver import ApiServer
from shared import service


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.devcluster.controlplane", description=__doc__)
    p.add_argument("--state-dir", required=True, help="kubeconfig and state file go here")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--node", action="append", default=[], help="create this Node at start (repeatable)")
    p.add_argument("--log-level", default=os.environ.get("DRANET_LOG_LEVEL", "INFO"))
    return p.parse_args(argv)


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    api = ApiServer(
        args.state_dir,
        host=args.host,
        port=args.port,
        state_file=os.path.join(args.state_dir, "state.json"),
    )
    async with api:
        cfg = client.Configuration()
        await config.load_kube_config(config_file=api.kubeconfig_path, client_configuration=cfg)
        async with client.ApiClient(cfg) as kube:
            core: Any = client.CoreV1Api(kube)
            existing = {n.metadata.name for n in (await core.list_node()).items}
            for node in args.node:
                if node not in existing:
                    await core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        allocator = await AllocatorController.from_kubeconfig(api.kubeconfig_path)
        await allocator.start()
        try:
            sys.stdout.write(json.dumps({"url": api.url, "kubeconfig": api.kubeconfig_path}) + "\n")
            sys.stdout.flush()
            await stop.wait()
        finally:
            await allocator.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    service.run("controlplane", args.log_level, lambda stop: run(args, stop))


if __name__ == "__main__":
    main()
