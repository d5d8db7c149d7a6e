"""The store as a real process on a real LMDB directory, through StoreClient."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest

from dev.cluster.procs import ServiceProcess
from proto.dranet.store.v1 import store_pb2 as pb
from proto.dranet.store.v1 import store_pb2_grpc
from shared.storeclient import StoreCallError, StoreClient


def make_config(pod: str, device: str, claim: str = "claim-1", payload: str = "") -> pb.DeviceConfig:
    body = payload or f'{{"interface":{{"name":"net-{device}"}}}}'
    return pb.DeviceConfig(
        pod=pb.PodRef(uid=pod, namespace="default", name=f"pod-{pod}"),
        device=device,
        claim=pb.ClaimRef(uid=claim, namespace="default", name=f"c-{claim}"),
        request="nic",
        driver="dra.net",
        pool="node-a",
        host_ifname=device,
        pod_config_json=body,
        # A checksum of the body, so a torn record would show.
        profile=hashlib.sha256(body.encode()).hexdigest(),
    )


def store_proc(tmp_path: Path, *extra: str) -> ServiceProcess:
    run = tmp_path / "run"
    return ServiceProcess(
        "services.store",
        ["--db-dir", str(tmp_path / "db"), "--run-dir", str(run), *extra],
        socket=run / "store.sock",
        log_path=tmp_path / "store.log",
    )


async def test_round_trip_and_reload_after_sigkill(tmp_path: Path) -> None:
    proc = store_proc(tmp_path).start()
    try:
        async with StoreClient(proc.socket) as c:
            revs = await c.put_devices([make_config("p1", "eth1"), make_config("p1", "eth2", claim="c2")])
            assert revs[0] == revs[1] > 0
            await c.put_attach_result(
                pb.AttachResult(
                    pod_uid="p1", device="eth1", interface_name="net1", ips=["10.0.0.2/24"], attached=True
                )
            )
            await c.touch_pod("p1", 123)
            got = await c.get_device("p1", "eth1")
            assert got is not None and got.host_ifname == "eth1" and got.revision == revs[0]
            assert await c.get_device("p1", "missing") is None
        proc.kill()
        proc.start()
        async with StoreClient(proc.socket) as c:
            state = await c.get_pod("p1")
            assert sorted(d.device for d in state.devices) == ["eth1", "eth2"]
            assert [r.interface_name for r in state.results] == ["net1"]
            assert state.activity.last_nri_activity_unix_nano == 123
            removed = await c.delete_claim("c2")
            assert [d.device for d in removed] == ["eth2"]
            # Idempotent: a second delete finds nothing and succeeds.
            assert await c.delete_claim("c2") == []
            assert await c.clear_attach_state("p1") == 2  # result + activity
            state = await c.get_pod("p1")
            assert [d.device for d in state.devices] == ["eth1"] and not state.results
    finally:
        proc.stop()


async def test_bad_input_names_the_field(tmp_path: Path) -> None:
    with store_proc(tmp_path) as proc:
        async with StoreClient(proc.socket, deadline_s=3) as c:
            with pytest.raises(StoreCallError) as err:
                await c.put_devices([make_config("", "eth1")])
            assert err.value.code == "INVALID_ARGUMENT" and "configs[0].pod_uid" in err.value.message
            with pytest.raises(StoreCallError) as err:
                await c.put_devices([make_config("p1", "a/b")])
            assert "configs[0].device" in err.value.message
            bad = make_config("p1", "eth1")
            bad.claim.uid = ""
            with pytest.raises(StoreCallError) as err:
                await c.put_devices([make_config("p1", "eth0"), bad])
            assert "configs[1].claim.uid" in err.value.message
            # Nothing of the rejected batch was stored.
            assert (await c.list()).devices == []


async def test_expect_new_refuses_a_held_device_and_writes_nothing(tmp_path: Path) -> None:
    with store_proc(tmp_path) as proc:
        async with StoreClient(proc.socket, deadline_s=3) as c:
            await c.put_devices([make_config("p1", "eth1", claim="c1")], expect_new=True)
            held = await c.get_device("p1", "eth1")
            assert held is not None
            # Another claim, or the same claim again over a final record: refused, and the
            # batch's free device (eth2) is not written either.
            for claim in ("c2", "c1"):
                with pytest.raises(StoreCallError) as err:
                    await c.put_devices(
                        [make_config("p1", "eth2", claim=claim), make_config("p1", "eth1", claim=claim)],
                        expect_new=True,
                    )
                assert err.value.code == "FAILED_PRECONDITION"
                assert err.value.message == (
                    "device eth1 of pod default/pod-p1 is already prepared by claim default/c-c1 (c1)"
                )
            assert [d.device for d in (await c.list()).devices] == ["eth1"]
            assert await c.get_device("p1", "eth1") == held
            # A provisional record of the same claim is replaced (a resumed prepare).
            prov = make_config("p1", "eth3", claim="c3")
            prov.provisional = True
            await c.put_devices([prov])
            await c.put_devices([make_config("p1", "eth3", claim="c3")], expect_new=True)
            got = await c.get_device("p1", "eth3")
            assert got is not None and not got.provisional
            # Without expect_new, a write replaces what is there (attach and tests rely on it).
            await c.put_devices([make_config("p1", "eth1", claim="c9")])
            got = await c.get_device("p1", "eth1")
            assert got is not None and got.claim.uid == "c9"


async def test_watch_initial_listing_then_changes(tmp_path: Path) -> None:
    with store_proc(tmp_path) as proc:
        async with StoreClient(proc.socket) as c:
            await c.put_devices([make_config("p1", "eth1")])
            events: list[pb.WatchEvent] = []
            synced = asyncio.Event()
            done = asyncio.Event()

            async def watch() -> None:
                async for ev in c.watch(initial=True):
                    events.append(ev)
                    if ev.type == pb.WatchEvent.SYNCED:
                        synced.set()
                    if ev.type == pb.WatchEvent.DELETE:
                        done.set()
                        return

            task = asyncio.create_task(watch())
            await asyncio.wait_for(synced.wait(), 5)
            await c.put_devices([make_config("p2", "eth2")])
            await c.delete_device("p1", "eth1")
            await asyncio.wait_for(done.wait(), 5)
            await task
            kinds = [(e.type, e.WhichOneof("record")) for e in events]
            assert kinds[0] == (pb.WatchEvent.PUT, "device") and events[0].device.device == "eth1"
            assert (pb.WatchEvent.PUT, "liveness") in kinds
            sync_at = kinds.index((pb.WatchEvent.SYNCED, None))
            after = [
                (e.type, e.WhichOneof("record"), getattr(e, e.WhichOneof("record") or "device").device)
                for e in events[sync_at + 1 :]
            ]
            assert after == [(pb.WatchEvent.PUT, "device", "eth2"), (pb.WatchEvent.DELETE, "device", "eth1")]
            revs = [e.revision for e in events[sync_at + 1 :]]
            assert revs == sorted(revs) and revs[0] < revs[1]


LIVENESS_CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    from proto.dranet.store.v1 import store_pb2 as pb
    from shared.storeclient import StoreClient

    async def main():
        async with StoreClient(sys.argv[1]) as c:
            async def reports():
                yield pb.LivenessReport(connected=True, runtime_name="containerd", instance="test")
                print("reported", flush=True)
                await asyncio.Event().wait()
            await c.hold_liveness(reports())

    asyncio.run(main())
    """
)


async def test_liveness_follows_the_attach_process(tmp_path: Path) -> None:
    with store_proc(tmp_path) as proc:
        async with StoreClient(proc.socket) as c:
            assert not (await c.get_liveness()).connected
            holder = subprocess.Popen(
                [sys.executable, "-c", LIVENESS_CLIENT, proc.socket], stdout=subprocess.PIPE, cwd=Path.cwd()
            )
            try:
                assert holder.stdout is not None
                assert holder.stdout.readline().strip() == b"reported"
                deadline = time.monotonic() + 5
                while not (live := await c.get_liveness()).connected:
                    assert time.monotonic() < deadline, "store never saw the liveness report"
                    await asyncio.sleep(0.02)
                assert live.runtime_name == "containerd"
                holder.kill()  # SIGKILL: the stream is never closed politely
                holder.wait()
                t0 = time.monotonic()
                while (await c.get_liveness()).connected:
                    assert time.monotonic() - t0 < 5, "store still reports a dead attach service as connected"
                    await asyncio.sleep(0.01)
            finally:
                holder.kill()
                holder.wait()


async def test_many_clients_at_once(tmp_path: Path) -> None:
    with store_proc(tmp_path) as proc:
        clients = [StoreClient(proc.socket) for _ in range(6)]
        try:

            async def writer(i: int, c: StoreClient) -> None:
                for j in range(40):
                    await c.put_devices([make_config(f"pod{i}", f"dev{j}", claim=f"claim{i}")])
                    got = await c.get_device(f"pod{i}", f"dev{j}")
                    assert got is not None and got.claim.uid == f"claim{i}"

            await asyncio.gather(*(writer(i, c) for i, c in enumerate(clients)))
            listing = await clients[0].list()
            assert len(listing.devices) == 6 * 40
            revisions = {d.revision for d in listing.devices}
            assert len(revisions) == 6 * 40, "every write got its own revision"
        finally:
            for c in clients:
                await c.close()


def test_unary_api_and_stale_socket(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # A socket file left by a dead process is replaced.
    import socket as pysocket

    s = pysocket.socket(pysocket.AF_UNIX)
    s.bind(str(run / "store.sock"))
    s.close()
    with store_proc(tmp_path) as proc:
        assert os.stat(proc.socket).st_mode & 0o777 == 0o600
        with grpc.insecure_channel(f"unix:{proc.socket}") as ch:
            stub = store_pb2_grpc.PodConfigStoreStub(ch)
            stub.PutDevices(pb.PutDevicesRequest(configs=[make_config("p9", "eth9")]))
            assert stub.GetDevice(pb.DeviceKey(pod_uid="p9", device="eth9")).host_ifname == "eth9"
            with pytest.raises(grpc.RpcError) as err:
                stub.GetDevice(pb.DeviceKey(pod_uid="p9", device="nope"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in (err.value.details() or "")
        # A live store is never stolen from: a second one waits (--takeover-wait), then refuses.
        second = ServiceProcess(
            "services.store",
            ["--db-dir", str(tmp_path / "db2"), "--run-dir", str(run), "--takeover-wait", "1"],
            socket=tmp_path / "never.sock",
            log_path=tmp_path / "second.log",
        )
        with pytest.raises(RuntimeError) as err:
            second.start(timeout=8)
        assert "another process is serving" in str(err.value)
        # Nor is its database: a store on the same directory, another socket, waits for it.
        third = ServiceProcess(
            "services.store",
            [
                "--db-dir",
                str(tmp_path / "db"),
                "--socket",
                str(tmp_path / "third.sock"),
                "--takeover-wait",
                "1",
            ],
            socket=tmp_path / "never.sock",
            log_path=tmp_path / "third.log",
        )
        with pytest.raises(RuntimeError) as err:
            third.start(timeout=8)
        assert "another store holds this database" in str(err.value)


async def test_a_new_store_takes_over_when_the_old_one_stops(tmp_path: Path) -> None:
    """A rollout: the new pod's store starts while the old one still serves (its attach is
    draining). It waits for the old one's database and socket, then serves every record."""
    old = store_proc(tmp_path).start()
    log = tmp_path / "new.log"
    new: subprocess.Popen[bytes] | None = None
    try:
        async with StoreClient(old.socket) as c:
            await c.put_devices([make_config("p1", "eth1")])
        with open(log, "ab") as out:
            new = subprocess.Popen(
                [sys.executable, "-m", "services.store", "--db-dir", str(tmp_path / "db"),
                 "--run-dir", str(tmp_path / "run")],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

        async def logged(text: str) -> None:
            deadline = time.monotonic() + 20
            while text not in log.read_text(errors="replace"):
                assert new is not None and new.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"no {text!r} in {log.read_text()}"
                await asyncio.sleep(0.1)

        await logged("waiting for the previous store to release the database")
        old.stop()
        await logged("store ready")
        async with StoreClient(old.socket) as c:
            got = await c.get_device("p1", "eth1")
        assert got is not None and got.host_ifname == "eth1"
    finally:
        if new is not None:
            new.terminate()
            assert new.wait(10) == 0
        old.stop()


async def test_map_grows_instead_of_failing(tmp_path: Path) -> None:
    proc = store_proc(tmp_path, "--map-size", str(256 * 1024)).start()
    try:
        async with StoreClient(proc.socket) as c:
            blob = "x" * 4000
            for i in range(300):  # ~1.2 MB of values into a 256 KiB map
                await c.put_devices([make_config("big", f"d{i}", payload=f'{{"profile":"{blob}{i}"}}')])
        assert "store map grown" in proc.log()
        proc.kill()
        proc.start()
        async with StoreClient(proc.socket) as c:
            assert len((await c.list(pod_uid="big")).devices) == 300
    finally:
        proc.stop()


@pytest.mark.slow
async def test_sigkill_at_random_moments_loses_no_acknowledged_write(tmp_path: Path) -> None:
    """A writer loop runs while the store is SIGKILLed at random moments and
    restarted. Every acknowledged write must be there afterwards, and every record
    must be whole (its checksum matches its body)."""
    proc = store_proc(tmp_path).start()
    acked: dict[tuple[str, str], str] = {}
    rng = random.Random(7)
    stop = asyncio.Event()

    async def writer() -> None:
        async with StoreClient(proc.socket, deadline_s=30) as c:
            i = 0
            while not stop.is_set():
                pod, dev = f"pod{i % 17}", f"dev{i}"
                body = f'{{"profile":"{rng.random()}-{i}"}}'
                await c.put_devices([make_config(pod, dev, payload=body)])
                acked[(pod, dev)] = body
                if i % 5 == 0:
                    victim = f"dev{i - 3}"
                    if (f"pod{(i - 3) % 17}", victim) in acked:
                        await c.delete_device(f"pod{(i - 3) % 17}", victim)
                        del acked[(f"pod{(i - 3) % 17}", victim)]
                i += 1

    task = asyncio.create_task(writer())
    try:
        for _ in range(12):
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            proc.kill()
            await asyncio.sleep(rng.uniform(0, 0.1))
            await asyncio.to_thread(proc.start)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(task, 60)
        print(f"acknowledged writes surviving 12 SIGKILLs: {len(acked)}")
        assert len(acked) > 50, f"too few writes got through ({len(acked)})"
        proc.kill()
        proc.start()
        async with StoreClient(proc.socket) as c:
            listing = await c.list()
        stored = {(d.pod.uid, d.device): d for d in listing.devices}
        missing = [k for k in acked if k not in stored]
        assert not missing, f"acknowledged writes lost: {missing[:5]}"
        for key, body in acked.items():
            assert stored[key].pod_config_json == body
        for d in listing.devices:
            assert d.profile == hashlib.sha256(d.pod_config_json.encode()).hexdigest(), "torn record"
        # Deleted records stay deleted: the client retries every call until it is
        # acknowledged, so nothing in flight at a kill is left half-done either.
        extra = [k for k in stored if k not in acked]
        assert not extra, f"records that should be gone: {extra[:5]}"
    finally:
        stop.set()
        task.cancel()
        proc.stop()


async def test_sigterm_with_open_streams_stops_cleanly(tmp_path: Path) -> None:
    """A stop while clients hold a Watch, a Session and a ReportLiveness stream (as when the
    whole pod stops at once): the store ends them itself; no ERROR line, no traceback, exit 0."""
    proc = store_proc(tmp_path).start()
    client = StoreClient(proc.socket)
    seen: list[pb.WatchEvent] = []

    async def watch() -> None:
        async for ev in client.watch(initial=True):
            seen.append(ev)

    async def reports():  # type: ignore[no-untyped-def]
        yield pb.LivenessReport(connected=True, runtime_name="test", instance="i-1")
        await asyncio.sleep(60)

    tasks = [asyncio.create_task(watch()), asyncio.create_task(client.hold_liveness(reports()))]
    try:
        await client.put_devices([make_config("p1", "eth1")])  # opens the Session
        deadline = time.monotonic() + 10
        while not (await client.get_liveness()).connected:
            assert time.monotonic() < deadline, "liveness never reported"
            await asyncio.sleep(0.05)
        assert any(ev.type == pb.WatchEvent.SYNCED for ev in seen)
        t0 = time.monotonic()
        assert proc.stop(timeout=10) == 0
        assert time.monotonic() - t0 < 5
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
    log = proc.log()
    assert '"level": "ERROR"' not in log and "Traceback" not in log, log
