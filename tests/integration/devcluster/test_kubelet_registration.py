"""The kubelet emulator's plugin manager against a DRA plugin served over the real registration and
DRA protos on Unix sockets: version choice, rejection, deregistration, re-registration, health."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from services.devcluster.kubelet_plugins import (
    ClaimRef,
    ClaimResult,
    PluginEvent,
    PluginManager,
    PreparedDevice,
    check_prepare_response,
    check_unprepare_response,
    choose_service,
)
from tests.fixtures_runtime import FakeDraPlugin

MakePlugin = Callable[..., Awaitable[FakeDraPlugin]]
CLAIM = ClaimRef(namespace="default", uid="uid-c1", name="c1")


@pytest.fixture
async def manager(kubelet_root: Path, request: pytest.FixtureRequest) -> AsyncIterator[PluginManager]:
    """The plugin manager; probing every 0.2 s when parametrized with ``{"fast_probes": True}``, else
    at the kubelet's 10 s (so a slow machine cannot fail probes in tests about something else)."""
    fast = bool((getattr(request, "param", None) or {}).get("fast_probes"))
    m = PluginManager(
        kubelet_root / "plugins_registry",
        health_interval=0.2 if fast else 10.0,
        health_dial_timeout=2.0 if fast else 20.0,
    )
    await m.start()
    try:
        yield m
    finally:
        await m.stop()


def kind(k: str, driver: str = "dra.net") -> Callable[[PluginEvent], bool]:
    return lambda ev: ev.kind == k and ev.driver == driver


async def test_v1_chosen_when_offered_first(manager: PluginManager, fake_dra_plugin: MakePlugin) -> None:
    plugin = await fake_dra_plugin(versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"])
    ev = await manager.wait_for_event(kind("registered"), within=5)
    assert ev.socket == str(plugin.reg_socket)
    p = manager.get("dra.net")
    assert p is not None and p.service == "v1.DRAPlugin" and p.endpoint == str(plugin.endpoint)
    assert plugin.statuses == [(True, "")]

    results = await p.node_prepare_resources([CLAIM])
    assert plugin.calls[-1].version == "v1" and plugin.calls[-1].method == "NodePrepareResources"
    assert plugin.calls[-1].claims == (("default", "c1", "uid-c1"),)
    assert results == {
        "uid-c1": ClaimResult(
            devices=(PreparedDevice(("nic",), "node-1", "dev-c1", ("dra.net/net=c1",), None),), error=""
        )
    }
    assert await p.node_unprepare_resources([CLAIM]) == {"uid-c1": ""}
    assert plugin.calls[-1].version == "v1" and plugin.prepared == set()


@pytest.mark.parametrize(
    "versions",
    [
        ["v1beta1.DRAPlugin"],
        ["v1alpha4.NodeService", "v1beta1.DRAPlugin"],
        ["v1beta1.DRAPlugin", "v1.DRAPlugin"],
    ],
)
async def test_v1beta1_fallback_follows_the_plugins_list(
    manager: PluginManager, fake_dra_plugin: MakePlugin, versions: list[str]
) -> None:
    plugin = await fake_dra_plugin(versions=versions, serve=["v1beta1"])
    await manager.wait_for_event(kind("registered"), within=5)
    p = manager.get("dra.net")
    assert p is not None and p.service == "v1beta1.DRAPlugin" and p.version == "v1beta1"
    await p.node_prepare_resources([CLAIM])
    assert [c.version for c in plugin.calls] == ["v1beta1"]


@pytest.mark.parametrize(
    ("kw", "expect"),
    [
        ({"versions": ["v1alpha3.Node"]}, "none of the offered services"),
        ({"versions": []}, "supported_versions is empty"),
        ({"plugin_type": "CSIPlugin"}, "no handler registered for plugin type: CSIPlugin"),
    ],
)
async def test_plugin_the_kubelet_cannot_use_is_rejected(
    manager: PluginManager, fake_dra_plugin: MakePlugin, kw: dict[str, object], expect: str
) -> None:
    plugin = await fake_dra_plugin(**kw)
    ev = await manager.wait_for_event(kind("rejected"), within=5)
    assert expect in ev.detail
    assert manager.get("dra.net") is None
    assert plugin.statuses and plugin.statuses[0][0] is False and expect in plugin.statuses[0][1]


async def test_deregistration_on_socket_removal_and_re_registration(
    manager: PluginManager, fake_dra_plugin: MakePlugin
) -> None:
    plugin = await fake_dra_plugin()
    await manager.wait_for_event(kind("registered"), within=5)
    n = len(manager.events)

    await plugin.stop_registration()  # removes the registration socket file
    ev = await manager.wait_for_event(kind("deregistered"), within=5, since=n)
    assert ev.detail == "socket removed"
    assert manager.get("dra.net") is None

    n = len(manager.events)
    await plugin.start_registration()
    await manager.wait_for_event(kind("registered"), within=5, since=n)
    p = manager.get("dra.net")
    assert p is not None and p.service == "v1.DRAPlugin"
    assert plugin.statuses == [(True, ""), (True, "")]
    await p.node_prepare_resources([CLAIM])
    assert len(plugin.calls_of("NodePrepareResources")) == 1


async def test_replaced_socket_registers_again(manager: PluginManager, fake_dra_plugin: MakePlugin) -> None:
    """A plugin restart replaces the socket file under the same name: a new registration."""
    plugin = await fake_dra_plugin()
    await manager.wait_for_event(kind("registered"), within=5)
    n = len(manager.events)
    await plugin.replace_registration()
    ev = await manager.wait_for_event(kind("deregistered"), within=5, since=n)
    assert ev.detail == "socket replaced"
    await manager.wait_for_event(kind("registered"), within=5, since=n)
    assert manager.get("dra.net") is not None
    assert plugin.statuses == [(True, ""), (True, "")]


@pytest.mark.parametrize("manager", [{"fast_probes": True}], indirect=True)
async def test_health_probe_deregisters_after_two_failures_and_re_registers(
    manager: PluginManager, fake_dra_plugin: MakePlugin
) -> None:
    plugin = await fake_dra_plugin()
    await manager.wait_for_event(kind("registered"), within=5)
    calls = plugin.get_info_calls
    n = len(manager.events)

    plugin.get_info_error = True
    ev = await manager.wait_for_event(kind("deregistered"), within=5, since=n)
    assert ev.detail == "2 failed GetInfo probes"
    assert plugin.get_info_calls >= calls + 2
    assert manager.get("dra.net") is None
    assert plugin.reg_socket.exists()

    n = len(manager.events)
    plugin.get_info_error = False
    await manager.wait_for_event(kind("registered"), within=5, since=n)
    assert manager.get("dra.net") is not None


async def test_hidden_files_and_non_sockets_are_ignored_and_subdirectories_watched(
    manager: PluginManager, kubelet_root: Path, fake_dra_plugin: MakePlugin
) -> None:
    registry = kubelet_root / "plugins_registry"
    (registry / "notes.txt").write_text("not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hidden:
        hidden.bind(str(registry / ".hidden.sock"))
        # A plugin in a subdirectory, with its own driver name.
        sub = await fake_dra_plugin(driver="other.example.com", registration_name="sub/other-reg.sock")
        await manager.wait_for_event(kind("registered", "other.example.com"), within=5)
        assert manager.get("other.example.com") is not None
        assert sub.reg_socket.parent.name == "sub"
        assert {e.socket for e in manager.events} == {str(sub.reg_socket)}


async def test_two_instances_of_one_driver_prefer_the_newest(
    manager: PluginManager, fake_dra_plugin: MakePlugin, kubelet_root: Path
) -> None:
    """A rolling update: two registration sockets, two endpoints; the newest connected one wins."""
    old = await fake_dra_plugin()
    await manager.wait_for_event(kind("registered"), within=5)
    n = len(manager.events)
    new = await fake_dra_plugin(registration_name="dra.net-new-reg.sock", endpoint_name="dra-new.sock")
    await manager.wait_for_event(kind("registered"), within=5, since=n)
    p = manager.get("dra.net")
    assert p is not None and p.endpoint == str(new.endpoint)
    await p.node_prepare_resources([CLAIM])
    assert new.calls and not old.calls

    # A third registration socket advertising an endpoint that is already registered is refused.
    n = len(manager.events)
    dup = FakeDraPlugin(kubelet_root, registration_name="dra.net-dup-reg.sock", endpoint_name="dra-new.sock")
    await dup.start_registration()
    try:
        ev = await manager.wait_for_event(kind("rejected"), within=5, since=n)
        assert "already registered" in ev.detail
    finally:
        await dup.stop_registration()


async def test_dra_call_errors_reach_the_caller(manager: PluginManager, fake_dra_plugin: MakePlugin) -> None:
    plugin = await fake_dra_plugin()
    p = await manager.wait_for_plugin("dra.net", within=5)
    plugin.prepare_abort = grpc.StatusCode.INTERNAL
    with pytest.raises(grpc.RpcError) as e:
        await p.node_prepare_resources([CLAIM])
    assert e.value.code() == grpc.StatusCode.INTERNAL
    plugin.prepare_abort = None
    plugin.prepare_errors["uid-c1"] = "no such device"
    assert (await p.node_prepare_resources([CLAIM]))["uid-c1"].error == "no such device"


# -- the kubelet's response rules (pure) -------------------------------------------------------

A = ClaimRef("ns", "ua", "a")
B = ClaimRef("ns", "ub", "b")
OK = ClaimResult(devices=(), error="")


@pytest.mark.parametrize(
    ("requested", "results", "ok", "errors"),
    [
        ([A, B], {"ua": OK, "ub": OK}, {"ua", "ub"}, []),
        (
            [A, B],
            {"ua": OK, "ub": ClaimResult((), "boom")},
            {"ua"},
            ["NodePrepareResources failed for ResourceClaim ns/b: boom"],
        ),
        ([A, B], {"ua": OK}, {"ua"}, ["NodePrepareResources of driver d skipped 1 ResourceClaims"]),
        (
            [A],
            {"ua": OK, "zz": OK},
            {"ua"},
            ["NodePrepareResources of driver d returned result for unknown claim UID zz"],
        ),
    ],
)
def test_prepare_response_rules(
    requested: list[ClaimRef], results: dict[str, ClaimResult], ok: set[str], errors: list[str]
) -> None:
    got_ok, got_errors = check_prepare_response("d", requested, results)
    assert set(got_ok) == ok and got_errors == errors


def test_unprepare_response_rules() -> None:
    assert check_unprepare_response("d", [A, B], {"ua": "", "ub": ""}) == ({"ua", "ub"}, [])
    assert check_unprepare_response("d", [A, B], {"ua": "", "ub": "busy"}) == (
        {"ua"},
        ["NodeUnprepareResources failed for ResourceClaim ns/b: busy"],
    )
    assert check_unprepare_response("d", [A, B], {"ua": ""})[1] == [
        "NodeUnprepareResources of driver d skipped 1 ResourceClaims"
    ]


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [
        (["v1.DRAPlugin", "v1beta1.DRAPlugin"], "v1.DRAPlugin"),
        (["v1beta1.DRAPlugin", "v1.DRAPlugin"], "v1beta1.DRAPlugin"),
        (["v1alpha3.Node", "v1beta1.DRAPlugin"], "v1beta1.DRAPlugin"),
        (["v1alpha3.Node"], None),
        ([], None),
    ],
)
def test_choose_service(offered: list[str], chosen: str | None) -> None:
    assert choose_service(offered) == chosen
