"""--feature-gates, parsed as Kubernetes' component-base featuregate parses it."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from shared import features
from shared.features import FeatureGateError, Gate

LIST = Gate.DRA_LIST_TYPE_ATTRIBUTES
PERSIST = Gate.PERSISTENT_RESOURCE_SLICE_ATTRIBUTES


def test_defaults_are_dranets_both_off() -> None:
    gates = features.parse("")
    assert gates.enabled == {LIST: False, PERSIST: False}
    assert not gates.persistent_slice_attributes and not gates.list_type_attributes
    assert gates == features.FeatureGates()
    assert str(gates) == "DRAListTypeAttributes=false,PersistentResourceSliceAttributes=false"


@pytest.mark.parametrize(
    ("text", "persist", "lists"),
    [
        ("PersistentResourceSliceAttributes=true", True, False),
        ("DRAListTypeAttributes=true", False, True),
        ("PersistentResourceSliceAttributes=true,DRAListTypeAttributes=true", True, True),
        (" PersistentResourceSliceAttributes = true , DRAListTypeAttributes=false ", True, False),
        ("PersistentResourceSliceAttributes=true,", True, False),
        (",,PersistentResourceSliceAttributes=true, ", True, False),
        # strconv.ParseBool spellings
        ("PersistentResourceSliceAttributes=1", True, False),
        ("PersistentResourceSliceAttributes=T", True, False),
        ("PersistentResourceSliceAttributes=TRUE,DRAListTypeAttributes=True", True, True),
        ("PersistentResourceSliceAttributes=t,DRAListTypeAttributes=0", True, False),
        # a later pair wins
        ("PersistentResourceSliceAttributes=true,PersistentResourceSliceAttributes=false", False, False),
        # the special gates every Kubernetes component has; an explicit gate wins over them
        ("AllAlpha=true", True, True),
        ("AllAlpha=true,DRAListTypeAttributes=false", True, False),
        ("DRAListTypeAttributes=false,AllAlpha=true", True, False),
        ("AllAlpha=false,PersistentResourceSliceAttributes=true", True, False),
        ("AllBeta=true", False, False),
    ],
)
def test_parse(text: str, persist: bool, lists: bool) -> None:
    gates = features.parse(text)
    assert (gates.persistent_slice_attributes, gates.list_type_attributes) == (persist, lists)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "persistentResourceSliceAttributes=true",
            "unrecognized feature gate: persistentResourceSliceAttributes",
        ),
        ("Foo=true", "unrecognized feature gate: Foo"),
        ("PersistentResourceSliceAttributes=true,Bar=false", "unrecognized feature gate: Bar"),
        ("PersistentResourceSliceAttributes", "missing bool value for PersistentResourceSliceAttributes"),
        ("PersistentResourceSliceAttributes=yes", "invalid value of PersistentResourceSliceAttributes=yes"),
        ("DRAListTypeAttributes=", "invalid value of DRAListTypeAttributes="),
        ("DRAListTypeAttributes=on", "invalid value of DRAListTypeAttributes=on"),
        ("=true", "missing feature gate name"),
    ],
)
def test_errors_name_the_gate_or_value(text: str, message: str) -> None:
    with pytest.raises(FeatureGateError, match=message.replace("[", r"\[")):
        features.parse(text)


def test_unknown_gate_lists_the_known_ones() -> None:
    with pytest.raises(FeatureGateError) as err:
        features.parse("Nope=true")
    assert "DRAListTypeAttributes" in str(err.value) and "PersistentResourceSliceAttributes" in str(err.value)


def test_the_flag_stops_a_parser_with_the_gate_named() -> None:
    p = argparse.ArgumentParser(prog="dranet-x")
    features.add_flag(p)
    assert p.parse_args([]).feature_gates == features.FeatureGates()
    assert p.parse_args(["--feature-gates=AllAlpha=true"]).feature_gates.persistent_slice_attributes
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        p.parse_args(["--feature-gates", "PersistentResourceSliceAttributes=maybe"])
    assert exit_.value.code != 0
    assert (
        "argument --feature-gates: invalid value of PersistentResourceSliceAttributes=maybe" in err.getvalue()
    )
