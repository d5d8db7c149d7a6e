"""Names from the API (and from stored records) that end up in keys, file paths and
netlink names cannot escape.

Where names become something else, and what is checked here:
- store keys ``<pod uid>/<device>`` (services/store/db.py): refused naming the field, or
  a key that splits back into exactly the same two names;
- interface and VRF names from a claim's config (shared/netconfig interface_name_problem):
  whatever passes is a name the kernel takes as it is (checked against the real kernel
  in a scratch netns by renaming a link) and obeys its rules;
- ResourceSlice device names from interface names (shared/names.py): a DNS-1123 label;
- names in a stored DeviceConfig that attach turns into netlink names and
  /proc/sys/net/*/conf/<name>/ paths (shared/attachplan DeviceSpec.from_proto);
- RDMA device file paths a stored config asks attach to add to containers
  (services/attach/rdma.py check_device_nodes): only files directly in /dev/infiniband;
- the pod netns path attach opens (services/attach/netns.py): a network namespace or a
  NetnsError, never another file.
There is no CDI spec file in this driver (devices reach containers through NRI)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.dranet.store.v1 import store_pb2 as pb
from services.attach.rdma import check_device_nodes
from services.store.db import InvalidArgument, _split_key, device_key
from shared.attachplan import (
    AttachObservation,
    DeviceNode,
    DeviceSpec,
    LinkState,
    PlanError,
    WriteSysctl,
    plan_attach,
)
from shared.names import decode_interface_name, is_dns1123_label, normalize_interface_name
from shared.netconfig.validate import MAX_IFNAME_BYTES, interface_name_problem
from shared.netns import NetnsError, open_netns

HOSTILE = [
    "",
    ".",
    "..",
    "../../etc/passwd",
    "/etc/passwd",
    "a/b",
    "eth0/../../x",
    "\x00",
    "eth\x000",
    "eth0\n",
    "eth0\r",
    "\teth0",
    "eth 0",
    "eth0\u00a0",  # no-break space
    "\u2028",  # line separator
    "é",
    "ethé0",
    "à1",  # UTF-8 c3 a0: the kernel takes 0xa0 for a space
    "all",  # the kernel refuses both: /proc/sys/net/*/conf/{all,default}
    "default",
    "👍",
    "\u202eeth0",
    "a" * 15,
    "a" * 16,
    "é" * 8,  # 8 characters, 16 bytes
    "a" * 300,
    "eth%d",
    "eth:0",
    "-",
    "lo",
]
names = st.one_of(
    st.sampled_from(HOSTILE), st.text(max_size=20), st.text(st.characters(codec="ascii"), max_size=16)
)


# -- store keys ----------------------------------------------------------------------------------


@settings(max_examples=500)
@given(
    st.one_of(st.sampled_from(HOSTILE), st.text(max_size=300)),
    st.one_of(st.sampled_from(HOSTILE), st.text(max_size=300)),
)
def test_store_keys_are_refused_naming_the_field_or_split_back_exactly(pod: str, device: str) -> None:
    try:
        key = device_key(pod, device)
    except InvalidArgument as exc:
        assert str(exc).startswith(("pod_uid:", "device:")), exc
        return
    assert _split_key(key) == (pod, device)
    assert len(key) <= 511, "LMDB's key limit"


# -- interface names against the kernel ------------------------------------------------------------

# Renames a bridge in a scratch netns (the rename attach does with RenameLink), reads
# the name back and renames it back. One JSON line per name in and out.
ORACLE = textwrap.dedent(
    """
    import json, sys
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        ipr.link("add", ifname="fz0", kind="bridge")
        idx = ipr.link_lookup(ifname="fz0")[0]
        for line in sys.stdin:
            name = json.loads(line)
            try:
                ipr.link("set", index=idx, ifname=name)
                got = ipr.get_links(idx)[0].get("ifname")
                ipr.link("set", index=idx, ifname="fz0")
                print(json.dumps({"ok": True, "name": got}), flush=True)
            except Exception as e:
                if getattr(e, "code", None) == 17:  # EEXIST: a valid name another link holds ("lo")
                    print(json.dumps({"ok": True, "name": name}), flush=True)
                else:
                    print(json.dumps({"ok": False, "error": str(e)}), flush=True)
    """
)


@pytest.fixture(scope="module")
def kernel() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        ["unshare", "--net", sys.executable, "-c", ORACLE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def kernel_takes(kernel: subprocess.Popen[str], name: str) -> tuple[bool, str]:
    assert kernel.stdin is not None and kernel.stdout is not None
    kernel.stdin.write(json.dumps(name) + "\n")
    kernel.stdin.flush()
    answer = json.loads(kernel.stdout.readline())
    return answer["ok"], answer.get("name", answer.get("error", ""))


@pytest.mark.root
@pytest.mark.netns
@settings(max_examples=300, deadline=None)
@given(names)
def test_accepted_interface_names_are_names_the_kernel_takes_as_they_are(
    kernel: subprocess.Popen[str], name: str
) -> None:
    problem = interface_name_problem(name)
    if problem is not None:
        return
    raw = name.encode()
    assert 0 < len(raw) <= MAX_IFNAME_BYTES
    assert name not in (".", "..")
    assert "/" not in name and "\x00" not in name and not any(ch.isspace() for ch in name)
    ok, got = kernel_takes(kernel, name)
    assert ok, f"{name!r} passes validation but the kernel refuses it: {got}"
    assert got == name, f"the kernel stored {got!r} for {name!r}"


# Of the hostile names, only these are interface names (the kernel takes any bytes but
# NUL, '/', ':' and whitespace; '%' is refused too, it is the kernel's name template).
ACCEPTED = {"é", "ethé0", "👍", "a" * 15, "-", "lo"}


@pytest.mark.parametrize("name", HOSTILE, ids=[repr(n)[:20] for n in HOSTILE])
def test_hostile_interface_names_are_refused(name: str) -> None:
    assert (interface_name_problem(name) is None) == (name in ACCEPTED), name


# -- device names ----------------------------------------------------------------------------------


def test_a_trailing_newline_is_no_dns_label() -> None:
    # re.match with "$" also matches before a final newline.
    assert not is_dns1123_label("eth0\n")
    assert normalize_interface_name("eth0\n") != "eth0\n"


@settings(max_examples=500)
@given(names)
def test_device_names_from_interface_names_are_dns_labels(ifname: str) -> None:
    if interface_name_problem(ifname) is not None:
        return  # the kernel never reports such a name
    device = normalize_interface_name(ifname)
    assert is_dns1123_label(device), device
    assert "\n" not in device and "/" not in device
    assert device == ifname or decode_interface_name(device) == ifname


# -- stored records attach acts on -------------------------------------------------------------------


def stored(host_ifname: str = "eth1", name: str = "", vrf: str = "") -> pb.DeviceConfig:
    itf: dict[str, object] = {"addresses": ["10.0.0.2/24"], "forwarding": True, "arpIgnore": 1}
    if name:
        itf["name"] = name
    if vrf:
        itf["vrf"] = {"name": vrf}
    return pb.DeviceConfig(
        pod=pb.PodRef(uid="p1"),
        device="eth1",
        host_ifname=host_ifname,
        pod_config_json=json.dumps({"interface": itf}),
    )


@pytest.mark.parametrize("bad", [n for n in HOSTILE if n and interface_name_problem(n)], ids=repr)
@pytest.mark.parametrize("where", ["host_ifname", "interface.name", "interface.vrf.name"])
def test_attach_refuses_stored_names_that_are_no_interface_names(where: str, bad: str) -> None:
    cfg = {
        "host_ifname": stored(host_ifname=bad),
        "interface.name": stored(name=bad),
        "interface.vrf.name": stored(vrf=bad),
    }[where]
    with pytest.raises(PlanError) as err:
        DeviceSpec.from_proto(cfg)
    assert where in str(err.value) and "device eth1" in str(err.value)


@settings(max_examples=300)
@given(names)
def test_sysctl_paths_stay_in_their_interface_directory(name: str) -> None:
    try:
        spec = DeviceSpec.from_proto(stored(name=name))
    except PlanError:
        assert interface_name_problem(name) is not None
        return
    seen = AttachObservation(on_host=LinkState(name="eth1", index=7, mac="02:00:00:00:00:01", up=True))
    plan = plan_attach(spec, "/var/run/netns/cni-1", seen)
    keys = [s.action.key for s in plan.steps if isinstance(s.action, WriteSysctl)]
    assert keys, "the config sets forwarding and arpIgnore"
    pod_name = name or "eth1"
    for key in keys:
        parts = key.split("/")
        if parts[2] == "conf":  # net/<family>/conf/<ifname>/<setting>
            assert parts[:2] in (["net", "ipv4"], ["net", "ipv6"]) and len(parts) == 5, key
            assert parts[3] == pod_name and parts[4] in ("forwarding", "arp_ignore", "arp_announce"), key
        else:  # net/ipv4/<setting>: the VRF's l3mdev switches
            assert len(parts) == 3 and parts[:2] == ["net", "ipv4"], key


# -- RDMA device files ----------------------------------------------------------------------------


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    """A fake /dev: a real uverbs0 node in dev/infiniband, and 'disks' around it."""
    ib = tmp_path / "dev" / "infiniband"
    ib.mkdir(parents=True)
    os.mknod(ib / "uverbs0", stat.S_IFCHR | 0o666, os.makedev(231, 192))
    os.mknod(tmp_path / "dev" / "sda", stat.S_IFBLK | 0o660, os.makedev(8, 0))
    os.mknod(tmp_path / "dev" / "mem", stat.S_IFCHR | 0o640, os.makedev(1, 1))
    (ib / "sub").mkdir()
    os.mknod(ib / "sub" / "mem", stat.S_IFCHR | 0o640, os.makedev(1, 1))
    return tmp_path


@pytest.mark.root
@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/dev/infiniband/../mem", "c"),
        ("/dev/infiniband/../sda", "b"),
        ("/dev/mem", "c"),
        ("/dev/sda", "b"),
        ("dev/infiniband/uverbs0", "c"),  # relative
        ("/dev/infiniband//uverbs0", "c"),
        ("/dev/infiniband/./uverbs0", "c"),
        ("/dev/infiniband/sub/mem", "c"),
        ("/dev/infiniband/uverbs0\x00", "c"),
        ("/dev/infiniband", "c"),
        ("/../dev/mem", "c"),
    ],
)
def test_only_files_directly_in_dev_infiniband_reach_a_container(
    dev_root: Path, path: str, kind: str
) -> None:
    good = DeviceNode("/dev/infiniband/uverbs0", "c", 231, 192)
    nodes, problems = check_device_nodes((DeviceNode(path, kind, 1, 1), good), str(dev_root))
    assert [n.path for n in nodes] == ["/dev/infiniband/uverbs0"]
    assert [p.path for p in problems] == [path]
    assert "/dev/infiniband" in problems[0].problem


# -- the pod netns path -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../../etc/passwd",
        "/dev/null",
        "/proc/self/ns/ipc",
        "/proc/self/ns/net\x00x",
        "/nonexistent",
    ],
)
def test_only_a_network_namespace_is_opened(path: str) -> None:
    with pytest.raises(NetnsError):
        fd = open_netns(path)
        os.close(fd)
