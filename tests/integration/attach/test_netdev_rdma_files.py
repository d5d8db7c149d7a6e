"""CreateContainer's RDMA device files against a fake /dev tree.

The nodes are real character devices made with mknod in a temp dir (root), with the
numbers the kernel gives RDMA devices: uverbsN 231:192+N, umadN 231:N, issmN 231:64+N,
ucmN 231:224+N (the IB_UVERBS/IB_UMAD major 231) and rdma_cm on the misc major 10.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from proto.dranet.store.v1 import store_pb2
from services.attach.rdma import check_device_nodes
from shared.attachplan import DeviceNode, container_devices

pytestmark = pytest.mark.root

IB = "/dev/infiniband"
NODES = {
    "rdma_cm": (10, 58, 0o666),
    "uverbs0": (231, 192, 0o666),
    "umad0": (231, 0, 0o600),
    "issm0": (231, 64, 0o600),
    "ucm0": (231, 224, 0o666),
    "uverbs1": (231, 193, 0o666),
    "umad1": (231, 1, 0o600),
}


def mknod(root: Path, name: str, major: int, minor: int, mode: int) -> None:
    path = root / IB.lstrip("/") / name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod applies the umask


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    for name, (major, minor, mode) in NODES.items():
        mknod(tmp_path, name, major, minor, mode)
    return tmp_path


def device(name: str, *files: str, record_mode: bool = False) -> store_pb2.DeviceConfig:
    """A DeviceConfig as prepare stores it for an RDMA device (mode recorded or not)."""
    cfg = store_pb2.DeviceConfig(device=name, host_ifname="", rdma_netns_mode="shared")
    cfg.rdma.link_dev = name
    for f in files:
        major, minor, mode = NODES[f]
        cfg.rdma.dev_chars.add(
            path=f"{IB}/{f}", type="c", major=major, minor=minor, file_mode=mode if record_mode else 0
        )
    return cfg


def test_every_container_gets_each_rdma_node_once_with_its_numbers_and_mode(dev_root: Path) -> None:
    mlx0 = device("mlx5_0", "rdma_cm", "uverbs0", "umad0", "issm0", "ucm0")
    mlx1 = device("mlx5_1", "rdma_cm", "uverbs1", "umad1")
    nodes, problems = check_device_nodes(container_devices([mlx0, mlx1]), str(dev_root))
    assert problems == []
    got = {n.path: (n.type, n.major, n.minor, n.file_mode) for n in nodes}
    assert got == {f"{IB}/{name}": ("c", major, minor, mode) for name, (major, minor, mode) in NODES.items()}
    assert all(n.uid == 0 and n.gid == 0 for n in nodes)


def test_recorded_mode_wins_over_the_files(dev_root: Path) -> None:
    cfg = device("mlx5_0", "umad0", record_mode=True)
    cfg.rdma.dev_chars[0].file_mode = 0o660
    nodes, _ = check_device_nodes(container_devices([cfg]), str(dev_root))
    assert nodes[0].file_mode == 0o660


def test_renumbered_missing_and_non_device_files_are_reported(dev_root: Path) -> None:
    # uverbs0 re-created with another minor since prepare; umad0 gone; issm0 a plain file.
    os.unlink(dev_root / "dev/infiniband/uverbs0")
    mknod(dev_root, "uverbs0", 231, 195, 0o666)
    os.unlink(dev_root / "dev/infiniband/umad0")
    os.unlink(dev_root / "dev/infiniband/issm0")
    (dev_root / "dev/infiniband/issm0").write_text("")
    cfg = device("mlx5_0", "rdma_cm", "uverbs0", "umad0", "issm0")
    nodes, problems = check_device_nodes(container_devices([cfg]), str(dev_root))
    assert [n.path for n in nodes] == [f"{IB}/rdma_cm", f"{IB}/uverbs0"]
    assert nodes[1] == DeviceNode(f"{IB}/uverbs0", "c", 231, 195, 0o666, 0, 0)
    assert [str(p) for p in problems] == [
        f"{IB}/uverbs0: is 231:195 now, config says 231:192; using 231:195",
        f"{IB}/umad0: cannot stat: No such file or directory",
        f"{IB}/issm0: is not a device file",
    ]
