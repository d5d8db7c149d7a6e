"""Name and label format checks with apimachinery's messages (``util/validation``).

Each checker returns a list of messages (empty when valid), as the Go helpers do, so a
caller can turn them into ``field.Invalid`` errors on whatever path it validates.
"""

from __future__ import annotations

import re
import secrets

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
C_IDENTIFIER = "[A-Za-z_][A-Za-z0-9_]*"

_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FMT = _LABEL_FMT + r"(\." + _LABEL_FMT + ")*"
_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(" + _QNAME_FMT + ")?"

_label_re = re.compile("^" + _LABEL_FMT + "$")
_subdomain_re = re.compile("^" + _SUBDOMAIN_FMT + "$")
_qname_re = re.compile("^" + _QNAME_FMT + "$")
_label_value_re = re.compile("^" + _LABEL_VALUE_FMT + "$")
_c_identifier_re = re.compile("^" + C_IDENTIFIER + "$")


def _regex_error(msg: str, fmt: str, examples: list[str]) -> str:
    shown = ",  or ".join(f"'{e}'" for e in examples)
    return f"{msg} (e.g. {shown}, regex used for validation is '{fmt}')"


def _max_len(n: int) -> str:
    return f"must be no more than {n} characters"


def _length_and_format(
    value: str, max_len: int, pattern: re.Pattern[str], msg: str, fmt: str, examples: list[str]
) -> list[str]:
    """At most ``max_len`` characters and a match of ``pattern`` (compiled from ``fmt``)."""
    errs = []
    if len(value) > max_len:
        errs.append(_max_len(max_len))
    if not pattern.match(value):
        errs.append(_regex_error(msg, fmt, examples))
    return errs


def dns1123_label(value: str) -> list[str]:
    return _length_and_format(
        value,
        DNS1123_LABEL_MAX,
        _label_re,
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
        "and must start and end with an alphanumeric character",
        _LABEL_FMT,
        ["my-name", "123-abc"],
    )


def dns1123_subdomain(value: str) -> list[str]:
    return _length_and_format(
        value,
        DNS1123_SUBDOMAIN_MAX,
        _subdomain_re,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
        "and must start and end with an alphanumeric character",
        _SUBDOMAIN_FMT,
        ["example.com"],
    )


def c_identifier(value: str) -> list[str]:
    if _c_identifier_re.match(value):
        return []
    return [
        _regex_error(
            "a valid C identifier must start with alphabetic character or '_', "
            "followed by a string of alphanumeric characters or '_'",
            C_IDENTIFIER,
            ["my_name", "MY_NAME", "MyName"],
        )
    ]


def qualified_name(value: str) -> list[str]:
    """Label keys, annotation keys and finalizers: ``[prefix/]name``."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in dns1123_subdomain(prefix))
    else:
        return [
            _regex_error(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start "
                "and end with an alphanumeric character",
                _QNAME_FMT,
                ["MyName", "my.name", "123-abc"],
            )
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errs.append("name part " + _max_len(QUALIFIED_NAME_MAX))
    if name and not _qname_re.match(name):
        errs.append(
            "name part "
            + _regex_error(
                "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character",
                _QNAME_FMT,
                ["MyName", "my.name", "123-abc"],
            )
        )
    return errs


def label_value(value: str) -> list[str]:
    return _length_and_format(
        value,
        LABEL_VALUE_MAX,
        _label_value_re,
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
        "and must start and end with an alphanumeric character",
        _LABEL_VALUE_FMT,
        ["MyValue", "my_value", "12345"],
    )


# names.SimpleNameGenerator: 5 characters from an alphabet without vowels and look-alikes.
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Generated names stay within 63 characters (maxNameLength 63 - randomLength 5).
_MAX_GENERATED_PREFIX = 58


def generate_name(base: str) -> str:
    """``generateName`` + 5 random characters; the base is cut to 58 characters first."""
    if len(base) > _MAX_GENERATED_PREFIX:
        base = base[:_MAX_GENERATED_PREFIX]
    return base + "".join(secrets.choice(_ALPHABET) for _ in range(5))
