"""A failed disk write fails the call and leaves the earlier value readable."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.procs import ServiceProcess
from shared.storeclient import StoreCallError, StoreClient
from tests.integration.store.test_store_process import make_config

pytestmark = pytest.mark.root


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: small enough to fill, and remountable read-only."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def start_store(tmp_path: Path, db_dir: Path) -> ServiceProcess:
    run = tmp_path / "run"
    return ServiceProcess(
        "services.store",
        [
            "--db-dir",
            str(db_dir),
            "--run-dir",
            str(run),
            "--map-size",
            str(1 << 20),
            "--max-map-size",
            str(64 << 20),
        ],
        socket=run / "store.sock",
        log_path=tmp_path / "store.log",
    ).start()


async def test_full_filesystem_fails_the_write_and_keeps_the_old_value(
    tmp_path: Path, small_fs: Path
) -> None:
    proc = start_store(tmp_path, small_fs / "db")
    try:
        async with StoreClient(proc.socket, deadline_s=5) as c:
            await c.put_devices([make_config("p1", "eth1", payload='{"profile":"before"}')])
            # Fill the filesystem, leaving a few KiB.
            filler = small_fs / "filler"
            with contextlib.suppress(OSError), open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            big = '{"profile":"' + "y" * 200_000 + '"}'
            with pytest.raises(StoreCallError) as err:
                await c.put_devices([make_config("p1", "eth1", payload=big)])
            assert err.value.code == "UNAVAILABLE"
            assert "disk write" in err.value.message and "nothing changed" in err.value.message
            got = await c.get_device("p1", "eth1")
            assert got is not None and got.pod_config_json == '{"profile":"before"}'
            # Space back: writes work again, without a restart.
            filler.unlink()
            await c.put_devices([make_config("p1", "eth1", payload='{"profile":"after"}')])
        proc.kill()
        proc.start()
        async with StoreClient(proc.socket) as c:
            got = await c.get_device("p1", "eth1")
            assert got is not None and got.pod_config_json == '{"profile":"after"}'
    finally:
        proc.stop()


def test_read_only_directory_at_start_is_a_clear_error(tmp_path: Path, small_fs: Path) -> None:
    """A store that cannot write its directory refuses to start and says where."""
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    run = tmp_path / "run"
    proc = ServiceProcess(
        "services.store",
        ["--db-dir", str(small_fs / "db"), "--run-dir", str(run)],
        socket=run / "store.sock",
        log_path=tmp_path / "store.log",
    )
    with pytest.raises(RuntimeError) as err:
        proc.start(timeout=10)
    assert proc.proc is not None and proc.proc.returncode not in (0, None)
    assert str(small_fs / "db") in str(err.value) and "Read-only file system" in str(err.value)
