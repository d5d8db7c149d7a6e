"""JSON logs whose level changes at run time."""

from __future__ import annotations

import io
import json
import logging

import pytest

from shared import logs


def test_json_lines_with_context_and_runtime_level() -> None:
    out = io.StringIO()
    logs.setup("unit", "INFO", stream=out)
    log = logging.getLogger("t")
    log.debug("hidden")
    log.info("prepared", extra=logs.log_fields(pod="p1", claim="default/c", device="eth1", empty=""))
    assert logs.set_level("debug") == "DEBUG"
    log.debug("now visible")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [entry["msg"] for entry in lines] == ["prepared", "now visible"]
    assert lines[0]["service"] == "unit" and lines[0]["level"] == "INFO"
    assert lines[0]["pod"] == "p1" and lines[0]["device"] == "eth1" and "empty" not in lines[0]
    assert logs.get_level() == "DEBUG"
    logs.set_level("INFO")


def test_bad_level_names_the_choices() -> None:
    with pytest.raises(ValueError, match="log level 'LOUD' is not one of DEBUG, INFO, WARNING, ERROR"):
        logs.set_level("LOUD")
    assert logs.normalize_level("warn") == "WARNING"


def test_fields_logger_adds_its_fields_and_the_call_can_add_or_override() -> None:
    out = io.StringIO()
    logs.setup("unit", "INFO", stream=out)
    log = logs.FieldsLogger(logging.getLogger("t.obj"), conn="nri/conn1", pod="", stream=None)
    log.info("one")
    log.info("two", extra=logs.log_fields(stream=3, conn="other"))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["conn"] == "nri/conn1" and "pod" not in lines[0] and "stream" not in lines[0]
    assert lines[1]["conn"] == "other" and lines[1]["stream"] == 3
