"""What the hooks hand the runtime and write to the store, without a store or a kernel:
the NRI LinuxDevice of a device file (hooks.linux_device) and the AttachResult
records (books.Records)."""

from __future__ import annotations

import pytest

from proto.dranet.store.v1 import store_pb2 as st
from services.attach.books import Held, Records
from services.attach.engine import Attached, Condition
from services.attach.hooks import linux_device
from shared.attachplan import DeviceNode


@pytest.mark.parametrize(
    ("node", "want"),
    [
        # (path, type, major, minor, file_mode, uid, gid); None: the field is unset
        (DeviceNode("/dev/infiniband/uverbs0", "c", 231, 192), ("c", 231, 192, None, None, None)),
        # NRI's file_mode is a Go os.FileMode: the file-type bits of st_mode are dropped.
        (
            DeviceNode("/dev/infiniband/uverbs0", "c", 231, 192, file_mode=0o20666, uid=0, gid=27),
            ("c", 231, 192, 0o666, 0, 27),
        ),
        (
            DeviceNode("/dev/infiniband/rdma_cm", "c", 10, 58, file_mode=0o1600),
            ("c", 10, 58, 0o1600, None, None),
        ),
    ],
)
def test_linux_device(node: DeviceNode, want: tuple[object, ...]) -> None:
    dev = linux_device(node)
    got = (
        dev.type,
        dev.major,
        dev.minor,
        dev.file_mode.value if dev.HasField("file_mode") else None,
        dev.uid.value if dev.HasField("uid") else None,
        dev.gid.value if dev.HasField("gid") else None,
    )
    assert dev.path == node.path
    assert got == want


def config() -> st.DeviceConfig:
    cfg = st.DeviceConfig(device="eth1", host_ifname="eth1")
    cfg.pod.uid = "uid-1"
    cfg.claim.namespace, cfg.claim.name = "default", "db-0"
    return cfg


def conditions(r: st.AttachResult) -> list[tuple[str, str, str]]:
    return [(c.type, c.status, c.reason) for c in r.conditions]


@pytest.mark.parametrize(
    ("cfg", "reported", "want"),
    [
        (
            config(),
            (),
            [("Ready", "True", "NetworkDeviceReady"), ("NetworkReady", "True", "NetworkReady")],
        ),
        (config(), (Condition("Ready", "True", "Mine"),), [("Ready", "True", "Mine")]),
    ],
)
def test_attached_record(
    cfg: st.DeviceConfig, reported: tuple[Condition, ...], want: list[tuple[str, str, str]]
) -> None:
    done = Attached("net1", ("192.0.2.5/24",), "02:00:00:00:00:01", reported)
    r = Records("dra.net").attached(cfg, done)
    assert (r.pod_uid, r.device, r.driver, r.host_ifname) == ("uid-1", "eth1", "dra.net", "eth1")
    assert (r.attached, r.interface_name, list(r.ips), r.hardware_address) == (
        True,
        "net1",
        ["192.0.2.5/24"],
        "02:00:00:00:00:01",
    )
    assert conditions(r) == want


def test_failed_and_returned_records() -> None:
    records = Records("dra.net")
    cfg = config()
    failed = records.failed(cfg, "device eth1: boom")
    assert (failed.attached, failed.error) == (False, "device eth1: boom")
    assert conditions(failed) == [("Ready", "False", "NetworkDeviceAttachFailed")]
    # Still in the pod: the earlier record is kept, marked as a failed return.
    earlier = records.attached(cfg, Attached("net1", hardware_address="02:00:00:00:00:01"))
    held = records.failed(cfg, "not returned", held=Held(earlier, "02:00:00:00:00:01"))
    assert (held.attached, held.interface_name, held.error) == (True, "net1", "not returned")
    assert conditions(held) == [("Ready", "False", "NetworkDeviceReturnFailed")]
    back = records.returned(earlier, "pod stopped")
    assert (back.attached, back.error, back.pod_uid, back.driver) == (
        False,
        "pod stopped",
        "uid-1",
        "dra.net",
    )
