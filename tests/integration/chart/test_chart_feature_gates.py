"""featureGates in the chart: rendered by the real Helm engine into --feature-gates for the
containers whose behaviour a gate changes (inventory and prepare), parsed by their own
parsers; an unknown gate or a non-boolean value is refused by values.schema.json."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from services.inventory.__main__ import build_parser as inventory_parser
from services.prepare.__main__ import parse_args as prepare_args
from shared.features import FeatureGates, Gate
from tests.integration.chart.test_chart import CHART, by_kind, render


def containers(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (ds,) = by_kind(render(values), "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["initContainers"] + spec["containers"]}


def gate_args(c: dict[str, Any]) -> list[str]:
    return [a for a in c["args"] if a.startswith("--feature-gates")]


def parsed(c: dict[str, Any]) -> FeatureGates:
    argv = [a.replace("$(NODE_NAME)", "node-a").replace("$(POD_IP)", "10.1.2.3") for a in c["args"]]
    if c["name"] == "inventory":
        return inventory_parser().parse_args(argv).feature_gates
    return prepare_args(argv).feature_gates


@pytest.mark.parametrize(
    ("gates", "flag", "persist", "lists"),
    [
        # dranet's defaults, both off, said explicitly
        (
            {},
            "--feature-gates=DRAListTypeAttributes=false,PersistentResourceSliceAttributes=false",
            False,
            False,
        ),
        (
            {"PersistentResourceSliceAttributes": True},
            "--feature-gates=DRAListTypeAttributes=false,PersistentResourceSliceAttributes=true",
            True,
            False,
        ),
        (
            {"PersistentResourceSliceAttributes": True, "DRAListTypeAttributes": True},
            "--feature-gates=DRAListTypeAttributes=true,PersistentResourceSliceAttributes=true",
            True,
            True,
        ),
    ],
    ids=["defaults", "persistent", "both"],
)
def test_feature_gates_rendered_for_inventory_and_prepare(
    gates: dict[str, bool], flag: str, persist: bool, lists: bool
) -> None:
    cs = containers({"featureGates": gates} if gates else {})
    for name in ("inventory", "prepare"):
        assert gate_args(cs[name]) == [flag], cs[name]["args"]
        got = parsed(cs[name])
        assert (got[Gate.PERSISTENT_RESOURCE_SLICE_ATTRIBUTES], got[Gate.DRA_LIST_TYPE_ATTRIBUTES]) == (
            persist,
            lists,
        )
    # store and attach behave the same with any gate: they get no flag
    assert gate_args(cs["store"]) == [] and gate_args(cs["attach"]) == []


def test_no_gates_no_flag() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render({"featureGates": None}, name="dranet", namespace="kube-system")
    assert "--feature-gates" not in "".join(manifests.values())


@pytest.mark.parametrize(
    "values",
    [{"featureGates": {"NoSuchGate": True}}, {"featureGates": {"PersistentResourceSliceAttributes": "yes"}}],
    ids=["unknown-gate", "not-a-bool"],
)
def test_schema_refuses_bad_gates(values: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="featureGates"):
        render(values)
