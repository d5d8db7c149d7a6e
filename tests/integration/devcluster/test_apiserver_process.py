"""The API server as its own process: the ready line, the kubeconfig, the state file across a clean stop
and a SIGKILL, and the start-up time (reported, not asserted)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .test_apiserver_client import slice_body

REPO = Path(__file__).resolve().parents[3]


@asynccontextmanager
async def server_process(
    state_dir: Path, state_file: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, dict[str, Any], float]]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.devcluster.apiserver",
        "--state-dir",
        str(state_dir),
        "--state-file",
        str(state_file),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        ready = json.loads(line)
        yield proc, ready, started
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def api_client(kubeconfig: str) -> client.ApiClient:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.ApiClient(cfg)


async def test_process_start_ready_line_and_state_across_restarts(tmp_path: Path) -> None:
    state_dir, state_file = tmp_path / "run", tmp_path / "state.json"
    async with server_process(state_dir, state_file) as (proc, ready, started):
        assert ready["kubeconfig"] == str(state_dir / "kubeconfig")
        assert ready["url"].startswith("http://127.0.0.1:")
        async with await api_client(ready["kubeconfig"]) as api:
            version = await client.VersionApi(api).get_code()
            ready_after = time.monotonic() - started
            print(f"\napiserver process: launch to first answered request {ready_after:.2f} s")
            assert (version.major, version.minor) == ("1", "34")
            r = client.ResourceV1Api(api)
            kept = await r.create_resource_slice(slice_body("kept", "node1"))
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    saved = json.loads(state_file.read_text())
    assert [o["metadata"]["name"] for o in saved["objects"]["resourceslices"]] == ["kept"]

    async with server_process(state_dir, state_file) as (proc, ready, _):
        async with await api_client(ready["kubeconfig"]) as api:
            r = client.ResourceV1Api(api)
            again = await r.read_resource_slice("kept")
            assert again.metadata.uid == kept.metadata.uid
            later = await r.create_resource_slice(slice_body("later", "node1"))
            assert int(later.metadata.resource_version) > int(kept.metadata.resource_version)
            # The watch history starts afresh: an older version is gone, as after an apiserver restart.
            with pytest.raises(ApiException) as gone:
                async with watch.Watch() as w:
                    async for _ in w.stream(r.list_resource_slice, resource_version="1", timeout_seconds=2):
                        pass
            assert gone.value.status == 410

        # Changes reach the file within a moment, so even a SIGKILL keeps them.
        deadline = time.monotonic() + 5
        while "later" not in state_file.read_text():
            assert time.monotonic() < deadline, "state file not written"
            await asyncio.sleep(0.05)
        proc.kill()
        await proc.wait()

    async with server_process(state_dir, state_file) as (_, ready, _):
        async with await api_client(ready["kubeconfig"]) as api:
            names = [s.metadata.name for s in (await client.ResourceV1Api(api).list_resource_slice()).items]
            assert names == ["kept", "later"]
    leftovers = [name for name in await asyncio.to_thread(os.listdir, tmp_path) if name.startswith(".state-")]
    assert leftovers == []
