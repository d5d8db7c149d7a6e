"""Allocation (services.devcluster.allocation): slices, classes and claims in, status.allocation out."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from services.devcluster.allocation import (
    AllocationAborted,
    Allocator,
    DeviceID,
    Unsatisfiable,
    gather_pools,
    in_use_devices,
    node_selector_matches,
    place_pod,
)

DRIVER = "dra.net"


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def nic(name: str, **attrs: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {"dra.net/ifName": {"string": name}}
    for key, value in attrs.items():
        kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "string"
        attributes[f"dra.net/{key}"] = {kind: value}
    return {"name": name, "attributes": attributes}


def rslice(
    node_name: str,
    devices: list[dict[str, Any]],
    *,
    generation: int = 1,
    count: int = 1,
    name: str | None = None,
    driver: str = DRIVER,
    pool: str | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name or f"{node_name}-{driver}-g{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": pool or node_name, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def device_class(name: str, *selectors: str, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in selectors]}
    if config:
        spec["config"] = config
    return {"metadata": {"name": name}, "spec": spec}


def exactly(
    name: str, cls: str = "dranet", *selectors: str, count: int = 1, mode: str = "ExactCount", **extra: Any
):
    body: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode, **extra}
    if mode == "ExactCount":
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": body}


def claim(
    name: str, *requests: dict[str, Any], config=None, constraints=None, ns: str = "default"
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if config:
        devices["config"] = config
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"devices": devices}}


def opaque(tag: str) -> dict[str, Any]:
    return {"opaque": {"driver": DRIVER, "parameters": {"tag": tag}}}


CLASSES = {
    "dranet": device_class("dranet", 'device.driver == "dra.net"'),
    "rdma": device_class("rdma", 'device.driver == "dra.net"', 'device.attributes["dra.net"].rdma == true'),
}
N1, N2 = node("n1", zone="a"), node("n2", zone="b")
N1_SLICE = rslice("n1", [nic("eth0", rdma=False), nic("eth1", rdma=True), nic("eth2", rdma=True)])
N2_SLICE = rslice("n2", [nic("eth0", rdma=True)])


def pin(node_name: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        ]
    }


def allocate(claims, slices=(N1_SLICE,), classes=CLASSES, in_use=frozenset(), on=N1) -> list[dict[str, Any]]:
    ids = (f"share-{i}" for i in itertools.count())
    return Allocator(list(slices), classes, in_use, new_share_id=lambda: next(ids)).allocate(on, claims)


def results(allocation: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["request"], r["device"]) for r in allocation["devices"].get("results", [])]


CASES = [
    # (title, claims, in-use devices, expected (request, device) per claim)
    ("one device, class selector", [claim("c", exactly("nic"))], set(), [[("nic", "eth0")]]),
    ("count 2", [claim("c", exactly("nic", count=2))], set(), [[("nic", "eth0"), ("nic", "eth1")]]),
    ("class selects rdma", [claim("c", exactly("nic", "rdma"))], set(), [[("nic", "eth1")]]),
    (
        "request selector narrows the class",
        [claim("c", exactly("nic", "rdma", 'device.attributes["dra.net"].ifName == "eth2"'))],
        set(),
        [[("nic", "eth2")]],
    ),
    (
        "All takes every match",
        [claim("c", exactly("nic", "rdma", mode="All"))],
        set(),
        [[("nic", "eth1"), ("nic", "eth2")]],
    ),
    ("in-use devices are skipped", [claim("c", exactly("nic"))], {"eth0", "eth1"}, [[("nic", "eth2")]]),
    (
        "two claims never share a device",
        [claim("a", exactly("nic", "rdma")), claim("b", exactly("nic", "rdma"))],
        set(),
        [[("nic", "eth1")], [("nic", "eth2")]],
    ),
    (
        "two requests in one claim",
        [
            claim(
                "c",
                exactly("plain", "dranet", 'device.attributes["dra.net"].rdma == false'),
                exactly("fast", "rdma"),
            )
        ],
        set(),
        [[("plain", "eth0"), ("fast", "eth1")]],
    ),
    (
        "firstAvailable: first subrequest that fits",
        [
            claim(
                "c",
                {
                    "name": "nic",
                    "firstAvailable": [
                        {
                            "name": "four",
                            "deviceClassName": "rdma",
                            "allocationMode": "ExactCount",
                            "count": 4,
                        },
                        {
                            "name": "two",
                            "deviceClassName": "rdma",
                            "allocationMode": "ExactCount",
                            "count": 2,
                        },
                        {
                            "name": "one",
                            "deviceClassName": "dranet",
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    ],
                },
            )
        ],
        set(),
        [[("nic/two", "eth1"), ("nic/two", "eth2")]],
    ),
    (
        "backtracking: the first pick for a greedy request leaves room for the next one",
        [
            claim(
                "c",
                exactly("any", "dranet"),
                exactly("zero", "dranet", 'device.attributes["dra.net"].ifName == "eth0"'),
            )
        ],
        set(),
        [[("any", "eth1"), ("zero", "eth0")]],
    ),
    (
        "matchAttribute keeps devices on one NUMA node",
        [
            claim(
                "c",
                exactly("a", "dranet", 'device.attributes["dra.net"].ifName == "eth1"'),
                exactly("b", "dranet"),
                constraints=[{"requests": ["a", "b"], "matchAttribute": "dra.net/numaNode"}],
            )
        ],
        set(),
        [[("a", "eth1"), ("b", "eth2")]],
    ),
]


@pytest.mark.parametrize(("title", "claims", "used", "expected"), CASES, ids=[c[0] for c in CASES])
def test_allocation_results(title: str, claims, used: set[str], expected) -> None:
    slices = [
        rslice(
            "n1",
            [
                nic("eth0", rdma=False, numaNode=0),
                nic("eth1", rdma=True, numaNode=1),
                nic("eth2", rdma=True, numaNode=1),
            ],
        )
    ]
    in_use = frozenset(DeviceID(DRIVER, "n1", d) for d in used)
    allocations = allocate(claims, slices=slices, in_use=in_use)
    assert [results(a) for a in allocations] == expected
    for allocation in allocations:
        assert allocation["nodeSelector"] == pin("n1")
        for result in allocation["devices"]["results"]:
            assert (result["driver"], result["pool"]) == (DRIVER, "n1")


UNSATISFIABLE = [
    (
        "not enough devices",
        [claim("c", exactly("nic", "rdma", count=3))],
        set(),
        "claim default/c, request nic: needs 3 device(s) of class rdma; 2 of 3 device(s) on node n1 match the "
        "class and request selectors, 0 of them already allocated or tainted",
    ),
    (
        "all matches in use",
        [claim("c", exactly("nic", "rdma"))],
        {"eth1", "eth2"},
        "claim default/c, request nic: needs 1 device(s) of class rdma; 2 of 3 device(s) on node n1 match the "
        "class and request selectors, 2 of them already allocated or tainted",
    ),
    (
        "request selector matches nothing",
        [claim("c", exactly("nic", "dranet", 'device.attributes["dra.net"].ifName == "eth9"'))],
        set(),
        "claim default/c, request nic: needs 1 device(s) of class dranet; 0 of 3",
    ),
    (
        "All with no match",
        [claim("c", exactly("nic", "dranet", 'device.attributes["dra.net"].ifName == "eth9"', mode="All"))],
        set(),
        "claim default/c, request nic: asks for all devices of class dranet and its selectors, and node n1 has none",
    ),
    (
        "missing class",
        [claim("c", exactly("nic", "nope"))],
        set(),
        "claim default/c, request nic: device class nope does not exist",
    ),
    (
        "competition between claims",
        [claim("a", exactly("nic", "rdma", count=2)), claim("b", exactly("nic", "rdma"))],
        set(),
        "claims default/a, default/b cannot be satisfied together on node n1",
    ),
    (
        "constraint rules out every pair",
        [
            claim(
                "c",
                exactly("a", "dranet", 'device.attributes["dra.net"].ifName == "eth0"'),
                exactly("b", "rdma"),
                constraints=[{"matchAttribute": "dra.net/rdma"}],
            )
        ],
        set(),
        "cannot be satisfied together on node n1",
    ),
    (
        "more than 32 results",
        [claim("c", exactly("nic", count=33))],
        set(),
        "claim default/c: number of requested devices 33 exceeds the claim limit of 32",
    ),
]


@pytest.mark.parametrize(
    ("title", "claims", "used", "reason"), UNSATISFIABLE, ids=[c[0] for c in UNSATISFIABLE]
)
def test_unsatisfiable_reason_names_claim_and_request(
    title: str, claims, used: set[str], reason: str
) -> None:
    in_use = frozenset(DeviceID(DRIVER, "n1", d) for d in used)
    with pytest.raises(Unsatisfiable) as caught:
        allocate(claims, in_use=in_use)
    assert reason in caught.value.reason


def test_config_order_class_first_then_claim() -> None:
    classes = {
        **CLASSES,
        "rdma": device_class(
            "rdma",
            'device.attributes["dra.net"].rdma == true',
            config=[opaque("class-rdma-1"), opaque("class-rdma-2")],
        ),
        "dranet": device_class("dranet", 'device.driver == "dra.net"', config=[opaque("class-dranet")]),
    }
    c = claim(
        "c",
        exactly("a", "rdma"),
        exactly("b", "dranet"),
        exactly("c", "rdma"),
        config=[
            {"requests": ["b"], **opaque("claim-b")},
            {**opaque("claim-all")},
            {"requests": ["a", "b", "c"], **opaque("claim-listed-all")},
            {"requests": ["zz"], **opaque("claim-other")},
        ],
    )
    slices = [rslice("n1", [nic("eth0", rdma=True), nic("eth1", rdma=False), nic("eth2", rdma=True)])]
    (allocation,) = allocate([c], slices=slices, classes=classes)
    config = allocation["devices"]["config"]
    assert [(e["source"], e.get("requests"), e["opaque"]["parameters"]["tag"]) for e in config] == [
        ("FromClass", ["a", "c"], "class-rdma-1"),
        ("FromClass", ["a", "c"], "class-rdma-2"),
        ("FromClass", ["b"], "class-dranet"),
        ("FromClaim", ["b"], "claim-b"),
        ("FromClaim", None, "claim-all"),
        # a config naming every request applies to all: Kubernetes drops the list
        ("FromClaim", None, "claim-listed-all"),
    ]
    assert all(e["opaque"]["driver"] == DRIVER for e in config)


def test_config_for_subrequest_uses_full_name() -> None:
    classes = {
        **CLASSES,
        "rdma": device_class("rdma", 'device.attributes["dra.net"].rdma == true', config=[opaque("x")]),
    }
    c = claim(
        "c",
        {
            "name": "nic",
            "firstAvailable": [
                {"name": "fast", "deviceClassName": "rdma", "allocationMode": "ExactCount", "count": 1},
                {"name": "slow", "deviceClassName": "dranet", "allocationMode": "ExactCount", "count": 1},
            ],
        },
        exactly("other", "dranet"),
        config=[{"requests": ["nic/fast"], **opaque("sub")}, {"requests": ["nic"], **opaque("parent")}],
    )
    (allocation,) = allocate([c], classes=classes)
    assert results(allocation) == [("nic/fast", "eth1"), ("other", "eth0")]
    assert [(e["source"], e.get("requests")) for e in allocation["devices"]["config"]] == [
        ("FromClass", ["nic/fast"]),
        ("FromClaim", ["nic/fast"]),
        ("FromClaim", ["nic"]),
    ]


def test_exact_allocation_shape() -> None:
    c = claim("c", exactly("nic", "rdma"))
    (allocation,) = allocate([c])
    assert allocation == {
        "devices": {"results": [{"request": "nic", "driver": "dra.net", "pool": "n1", "device": "eth1"}]},
        "nodeSelector": pin("n1"),
    }


GENERATIONS = [
    # (title, slices, expected device or None for unsatisfiable)
    (
        "newest generation wins",
        [rslice("n1", [nic("old")], generation=1), rslice("n1", [nic("new")], generation=2)],
        "new",
    ),
    (
        "pool with all its slices",
        [
            rslice("n1", [nic("a")], count=2, name="s1"),
            rslice("n1", [nic("b")], count=2, name="s2"),
        ],
        "a",
    ),
    ("incomplete pool is skipped", [rslice("n1", [nic("a")], count=2, name="s1")], None),
    (
        "incomplete newer generation does not revive the older one",
        [rslice("n1", [nic("old")], generation=1), rslice("n1", [nic("new")], generation=2, count=2)],
        None,
    ),
    (
        "a complete pool is used while another is incomplete",
        [
            rslice("n1", [nic("a")], count=2, name="s1", pool="p1"),
            rslice("n1", [nic("b")], name="s2", pool="p2"),
        ],
        "b",
    ),
    ("duplicate device names make the pool invalid", [rslice("n1", [nic("a"), nic("a")])], None),
    ("slices of other nodes are invisible", [rslice("n2", [nic("a")])], None),
]


@pytest.mark.parametrize(("title", "slices", "expected"), GENERATIONS, ids=[g[0] for g in GENERATIONS])
def test_pool_generations_and_completeness(title: str, slices, expected: str | None) -> None:
    c = claim("c", exactly("nic"))
    if expected is None:
        with pytest.raises(Unsatisfiable):
            allocate([c], slices=slices)
    else:
        (allocation,) = allocate([c], slices=slices)
        assert results(allocation) == [("nic", expected)]


def test_all_mode_refuses_incomplete_pool() -> None:
    slices = [rslice("n1", [nic("a")], count=2, name="s1")]
    with pytest.raises(
        Unsatisfiable, match=r"asks for all devices, but resource pool dra\.net/n1 is currently being updated"
    ):
        allocate([claim("c", exactly("nic", mode="All"))], slices=slices)


def test_incomplete_pool_counts_slices_that_target_other_nodes() -> None:
    # A pool spread over nodes: the slice for n2 is present, so the pool is complete for n1 too.
    shared = [
        rslice("n1", [nic("a")], count=2, name="s1", pool="shared"),
        rslice("n2", [nic("b")], count=2, name="s2", pool="shared"),
    ]
    pools = gather_pools(shared, N1)
    assert [(p.label, p.incomplete, [s["metadata"]["name"] for s in p.slices]) for p in pools] == [
        ("dra.net/shared", False, ["s1"])
    ]


def test_node_selector_and_all_nodes_slices() -> None:
    by_label = {
        "metadata": {"name": "zonal"},
        "spec": {
            "driver": DRIVER,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
                ]
            },
            "pool": {"name": "zonal", "generation": 1, "resourceSliceCount": 1},
            "devices": [nic("z0")],
        },
    }
    everywhere = {
        "metadata": {"name": "global"},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": "global", "generation": 1, "resourceSliceCount": 1},
            "devices": [nic("g0")],
        },
    }
    c = claim("c", exactly("nic", count=2))
    (allocation,) = allocate([c], slices=[by_label, everywhere], on=N2)
    assert results(allocation) == [("nic", "g0"), ("nic", "z0")]
    assert allocation["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]
    }
    (only_global,) = allocate([claim("c", exactly("nic"))], slices=[everywhere], on=N1)
    assert "nodeSelector" not in only_global
    with pytest.raises(Unsatisfiable):
        allocate([claim("c", exactly("nic", count=2))], slices=[by_label, everywhere], on=N1)


def test_shared_device_and_admin_access() -> None:
    shareable = {**nic("eth0"), "allowMultipleAllocations": True}
    slices = [rslice("n1", [shareable])]
    in_use = frozenset({DeviceID(DRIVER, "n1", "eth0")})
    (allocation,) = allocate([claim("c", exactly("nic"))], slices=slices, in_use=in_use)
    assert allocation["devices"]["results"][0]["shareID"] == "share-0"
    # but not twice in the same claim
    with pytest.raises(Unsatisfiable):
        allocate([claim("c", exactly("nic", count=2))], slices=slices)
    (admin,) = allocate(
        [claim("c", exactly("nic", adminAccess=True))], slices=[rslice("n1", [nic("eth0")])], in_use=in_use
    )
    assert admin["devices"]["results"] == [
        {"request": "nic", "driver": DRIVER, "pool": "n1", "device": "eth0", "adminAccess": True}
    ]


def test_taints_and_tolerations() -> None:
    tainted = {**nic("eth0"), "taints": [{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]}
    ignored = {**nic("eth1"), "taints": [{"key": "info", "effect": "None"}]}
    slices = [rslice("n1", [tainted, ignored])]
    (allocation,) = allocate([claim("c", exactly("nic"))], slices=slices)
    assert results(allocation) == [("nic", "eth1")]
    toleration = {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}
    (tolerated,) = allocate([claim("c", exactly("nic", count=2, tolerations=[toleration]))], slices=slices)
    assert results(tolerated) == [("nic", "eth0"), ("nic", "eth1")]
    assert tolerated["devices"]["results"][0]["tolerations"] == [toleration]


def test_cel_runtime_error_aborts_with_class_selector_and_device() -> None:
    classes = {"broken": device_class("broken", 'device.attributes["dra.net"].sriov == true')}
    with pytest.raises(AllocationAborted) as caught:
        allocate([claim("c", exactly("nic", "broken"))], classes=classes)
    assert str(caught.value) == (
        "class broken: selector #0 on device dra.net/n1/eth0: CEL runtime error: no such key: sriov"
    )
    with pytest.raises(AllocationAborted, match=r"claim default/c: selector #0 on device dra.net/n1/eth0"):
        allocate([claim("c", exactly("nic", "dranet", 'device.attributes["dra.net"].sriov'))])


def test_cel_compile_error_aborts() -> None:
    classes = {"bad": device_class("bad", "device.driver ==")}
    with pytest.raises(AllocationAborted, match=r"class bad: selector #0: CEL compile error: .*syntax error"):
        allocate([claim("c", exactly("nic", "bad"))], classes=classes)


def test_in_use_devices_ignores_admin_access() -> None:
    allocated = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "a", "driver": DRIVER, "pool": "n1", "device": "eth0"},
                        {
                            "request": "b",
                            "driver": DRIVER,
                            "pool": "n1",
                            "device": "eth1",
                            "adminAccess": True,
                        },
                    ]
                }
            }
        }
    }
    assert in_use_devices([allocated, {"status": {}}]) == {DeviceID(DRIVER, "n1", "eth0")}


SELECTORS = [
    (
        {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
        True,
    ),
    (
        {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}
            ]
        },
        False,
    ),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]}, True),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]}, True),
    (
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["3"]}]}]},
        True,
    ),
    ({"nodeSelectorTerms": [{}]}, False),
    (
        {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            ]
        },
        True,
    ),
    (None, True),
]


@pytest.mark.parametrize(("selector", "expected"), SELECTORS)
def test_node_selector_matches(selector, expected: bool) -> None:
    assert node_selector_matches(selector, node("n1", zone="a", rank="5")) is expected


def pod(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "uid": "u1"}, "spec": spec}


def test_place_pod_picks_a_node_that_has_the_devices() -> None:
    allocator = Allocator([N1_SLICE, N2_SLICE], CLASSES, frozenset())
    # n1 has two rdma devices, n2 one: two rdma devices only fit on n1
    placement = place_pod(pod(), [N2, N1], [claim("c", exactly("nic", "rdma", count=2))], [], allocator)
    assert placement.node == "n1"
    # with n1's rdma devices in use, n2 is the only choice
    busy = Allocator(
        [N1_SLICE, N2_SLICE], CLASSES, frozenset(DeviceID(DRIVER, "n1", d) for d in ("eth1", "eth2"))
    )
    placement = place_pod(pod(), [N1, N2], [claim("c", exactly("nic", "rdma"))], [], busy)
    assert placement.node == "n2"
    assert results(placement.allocations[0]) == [("nic", "eth0")]
    assert placement.allocations[0]["nodeSelector"] == pin("n2")


def test_place_pod_respects_pod_rules_and_allocated_claims() -> None:
    allocator = Allocator([N1_SLICE, N2_SLICE], CLASSES, frozenset())
    c = [claim("c", exactly("nic", "rdma"))]
    assert place_pod(pod(nodeSelector={"zone": "b"}), [N1, N2], c, [], allocator).node == "n2"
    assert place_pod(pod(nodeName="n2"), [N1, N2], c, [], allocator).node == "n2"
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
                ]
            }
        }
    }
    assert place_pod(pod(affinity=affinity), [N1, N2], c, [], allocator).node == "n2"
    shared = {**claim("shared", exactly("nic")), "status": {"allocation": {"nodeSelector": pin("n2")}}}
    assert place_pod(pod(), [N1, N2], c, [shared], allocator).node == "n2"
    # nothing to allocate, only the pinned claim: the pod follows it
    assert place_pod(pod(), [N1, N2], [], [shared], allocator).node == "n2"


def test_place_pod_unsatisfiable_lists_every_node() -> None:
    allocator = Allocator([N1_SLICE, N2_SLICE], CLASSES, frozenset())
    with pytest.raises(Unsatisfiable) as caught:
        place_pod(
            pod(nodeSelector={"zone": "a"}),
            [N1, N2],
            [claim("c", exactly("nic", "rdma", count=3))],
            [],
            allocator,
        )
    assert caught.value.reason == (
        "0/2 nodes are available: n1: claim default/c, request nic: needs 3 device(s) of class rdma; 2 of 3 "
        "device(s) on node n1 match the class and request selectors, 0 of them already allocated or tainted; "
        "n2: node does not match the pod's nodeSelector zone=a"
    )
