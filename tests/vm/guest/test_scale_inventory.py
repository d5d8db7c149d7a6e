"""The inventory at scale on a real kernel: 1,000 dummy NICs plus netdevsim PFs and VF
representors, scanned by the inventory service's own loop code, published through the
real Publisher into an in-memory API server (no API server in the guest).

Everything lives in a netns of its own with its own sysfs mount (sysfs shows the links
of the netns that mounted it), so the rest of the guest is untouched and the teardown is
one ``ip netns del`` (deleting 1,000 links one by one takes about 30 s under TCG).
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from services.inventory.discovery import Device
from services.inventory.filter import DEFAULT_FILTER, DeviceFilter
from services.inventory.inventory import Inventory, InventoryConfig
from services.inventory.pooling import MAX_DEVICES_PER_SLICE
from services.inventory.publisher import Publisher
from tests.vm.guest.kit import (
    NODE,
    FakeSliceClient,
    in_netns,
    ip_batch,
    netns,
    netns_path,
    record,
    sh,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.slow]

DUMMIES = 1000
NSIM_DEVICES = 4  # each a PF with 4 VF representors (netdevsim's default VF limit)
NSIM_VFS = 4
NSIM_BUS = Path("/sys/bus/netdevsim")


def make_nsims(ns: str, first_id: int) -> list[int]:
    """netdevsim devices whose ports are born in ``ns`` (a device's netdevs go to the netns
    of whoever writes new_device), in switchdev mode with their VF representors."""
    ids = list(range(first_id, first_id + NSIM_DEVICES))
    for i in ids:
        in_netns(netns_path(ns), lambda i=i: (NSIM_BUS / "new_device").write_text(f"{i} 1"))  # type: ignore[misc]
        (NSIM_BUS / "devices" / f"netdevsim{i}" / "sriov_numvfs").write_text(str(NSIM_VFS))
        sh(
            "ip",
            "netns",
            "exec",
            ns,
            "devlink",
            "dev",
            "eswitch",
            "set",
            f"netdevsim/netdevsim{i}",
            "mode",
            "switchdev",
        )
    return ids


async def scenario(sysfs: str, ns: str) -> dict[str, float | int]:
    published: list[Sequence[Device]] = []
    inv = Inventory(
        InventoryConfig(sysfs_root=sysfs),
        device_filter=DeviceFilter(DEFAULT_FILTER),
        on_publish=published.append,
    )
    api = FakeSliceClient()
    pub = Publisher(api, NODE)  # type: ignore[arg-type]
    await inv.start()

    async def scan_and_publish() -> tuple[float, int]:
        t0 = time.perf_counter()
        await inv.scan()
        took = time.perf_counter() - t0
        pub.set_devices([d.slice_entry() for d in published[-1]])
        before = len(api.writes)
        await pub.sync()
        return took, len(api.writes) - before

    full, writes = await scan_and_publish()
    n = len(inv.devices)
    expected_links = DUMMIES + NSIM_DEVICES * (1 + NSIM_VFS)
    assert n >= expected_links, (n, expected_links)
    assert writes == math.ceil(len(inv.published) / MAX_DEVICES_PER_SLICE), writes
    reps = [d for d in inv.devices.values() if d.ifname.startswith("eth")]
    assert len(reps) == NSIM_DEVICES * (1 + NSIM_VFS)

    again, noop_writes = await scan_and_publish()
    assert noop_writes == 0, f"a rescan of an unchanged host wrote {noop_writes} slices"

    # One change: one device's attributes, one slice rewritten.
    ip_batch(["link set sd500 mtu 9000", "addr add 192.0.2.50/24 dev sd500"], ns=ns)
    changed, change_writes = await scan_and_publish()
    d = inv.get("sd500")
    assert d is not None and d.attributes["dra.net/mtu"].to_json() == {"int": 9000}
    assert d.attributes["dra.net/ipv4"].to_json() == {"string": "192.0.2.50/24"}
    assert change_writes == 1, api.writes[-change_writes:]
    slices = [
        s for s in api.slices.values() if any(x["name"] == "sd500" for x in s["spec"].get("devices", []))
    ]
    (entry,) = [x for x in slices[0]["spec"]["devices"] if x["name"] == "sd500"]
    assert entry["attributes"]["dra.net/mtu"] == {"int": 9000}

    # A new link and a deleted one.
    ip_batch(["link add sdnew type dummy", "link del sd7"], ns=ns)
    churn, churn_writes = await scan_and_publish()
    assert inv.get("sdnew") is not None and inv.get("sd7") is None
    names = {x["name"] for s in api.slices.values() for x in s["spec"].get("devices", [])}
    assert "sdnew" in names and "sd7" not in names
    return {
        "devices": n,
        "published": len(inv.published),
        "slices": len(api.slices),
        "full_scan_s": round(full, 2),
        "noop_rescan_s": round(again, 2),
        "noop_rescan_writes": noop_writes,
        "change_rescan_s": round(changed, 2),
        "change_writes": change_writes,
        "add_delete_rescan_s": round(churn, 2),
        "add_delete_writes": churn_writes,
    }


async def test_full_scan_noop_rescan_and_a_change(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    with netns("dnscale") as ns:
        path = netns_path(ns)
        t0 = time.perf_counter()
        ip_batch([f"link add sd{i} type dummy" for i in range(1, DUMMIES + 1)], ns=ns)
        created = time.perf_counter() - t0
        ids = make_nsims(ns, first_id=21)
        try:
            in_netns(path, lambda: subprocess.run(["mount", "-t", "sysfs", "sysfs", str(sysfs)], check=True))
            wait_until(
                "the netdevsim representors", lambda: len(list((sysfs / "class/net").iterdir())) > DUMMIES
            )
            # The inventory's scans run in worker threads of the loop's thread: run the
            # loop in a thread that is in the netns.
            metrics = in_netns(path, lambda: asyncio.run(scenario(str(sysfs), ns)))
        finally:
            subprocess.run(["umount", str(sysfs)], check=False)
            for i in ids:
                (NSIM_BUS / "del_device").write_text(str(i))
    metrics["create_1000_dummies_s"] = round(created, 2)
    record("inventory.scale", **metrics)
    print(metrics)
