"""Netns pins (services/attach/pins.py) against the kernel: a pinned netns outlives its
path and every process, with the devices in it; removing the pin lets it go."""

from __future__ import annotations

import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.attach.pins import NetnsPins, PinError

pytestmark = [pytest.mark.root, pytest.mark.netns]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _has_link(netns_path: str, name: str) -> bool:
    out = subprocess.run(
        ["nsenter", f"--net={netns_path}", "ip", "link", "show", name], capture_output=True, text=True
    )
    return out.returncode == 0


@pytest.fixture
def pin_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "pins"
    d.mkdir()
    yield d
    for f in d.iterdir():  # a failed test must not leave a mount behind
        subprocess.run(["umount", "-l", str(f)], capture_output=True)


def test_a_pinned_netns_keeps_its_device_after_its_path_is_gone_and_goes_once_unpinned(pin_dir: Path) -> None:
    ns = f"pin-{secrets.token_hex(3)}"
    a, b = f"pa{secrets.token_hex(3)}", f"pb{secrets.token_hex(3)}"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        _ip("link", "set", b, "netns", ns)
        pins = NetnsPins(pin_dir)
        uid, sandbox = str(uuid.uuid4()), secrets.token_hex(32)
        path = pins.pin(uid, sandbox, f"/run/netns/{ns}")
        assert path == str(pin_dir / f"{uid}_{sandbox}")
        assert pins.pin(uid, sandbox, f"/run/netns/{ns}") == path  # once
        _ip("netns", "del", ns)  # what the runtime does when the sandbox stops
        # The veth pair would be gone with the netns; the pin holds it.
        assert _has_link(path, b)
        assert _ip("link", "show", a, check=False).returncode == 0
        assert pins.get(uid, sandbox) == path
        assert [(p.pod_uid, p.sandbox_id) for p in pins.all()] == [(uid, sandbox)]
        assert [p.path for p in pins.of_pod(uid)] == [path]
        pins.unpin(uid, sandbox)
        assert not os.path.exists(path)
        assert pins.get(uid, sandbox) is None and pins.all() == []
        # The last reference went: the kernel destroyed the netns and the veth with it.
        for _ in range(50):
            if _ip("link", "show", a, check=False).returncode != 0:
                break
            subprocess.run(["sleep", "0.1"])
        assert _ip("link", "show", a, check=False).returncode != 0
        pins.unpin(uid, sandbox)  # nothing pinned: nothing to do
    finally:
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", a, check=False)


def test_names_that_could_leave_the_directory_are_refused(pin_dir: Path) -> None:
    pins = NetnsPins(pin_dir)
    for uid, sandbox in (("../x", "a"), ("a", "b/../../c"), ("a" * 129, "b"), ("", "b"), ("a\n", "b")):
        with pytest.raises(PinError, match="uid or sandbox id"):
            pins.pin(uid, sandbox, "/proc/self/ns/net")
    assert list(pin_dir.iterdir()) == []


def test_a_path_that_is_no_netns_is_an_error_that_names_it_and_leaves_nothing(pin_dir: Path) -> None:
    pins = NetnsPins(pin_dir)
    with pytest.raises(PinError, match="cannot pin netns /nonexistent/ns"):
        pins.pin(str(uuid.uuid4()), "abc", "/nonexistent/ns")
    assert list(pin_dir.iterdir()) == []


def test_stray_files_are_cleared_and_pinning_off_does_nothing(pin_dir: Path) -> None:
    (pin_dir / "leftover_abc").touch()  # a pin file whose mount went (e.g. a host reboot of /run)
    (pin_dir / "odd name").touch()
    assert NetnsPins(pin_dir).all() == []
    assert list(pin_dir.iterdir()) == []
    off = NetnsPins(None)
    assert not off.enabled
    assert off.pin(str(uuid.uuid4()), "abc", "/proc/self/ns/net") is None
    assert off.get("a", "b") is None and off.all() == []
