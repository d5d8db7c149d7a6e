"""CEL for DRA device selection: compile once, evaluate per device. Pure, no I/O.

Two environments share one implementation:

* ``DRA`` -- the Kubernetes DRA selector environment (DeviceClass and ResourceClaim
  ``selectors[].cel.expression``): one variable ``device`` with ``driver``,
  ``attributes[domain][id]``, ``capacity[domain][id]`` and ``allowMultipleAllocations``, plus the
  Kubernetes CEL libraries selectors use (semver, quantity, ip/cidr, regex, lists, sets, cel-go strings
  extension, ``cel.bind``).
* ``FILTER`` -- dranet's publish-time ``--filter`` environment: one variable ``attributes``, a map
  from the qualified attribute name (``dra.net/type``) to a DeviceAttribute object with the Go field
  names ``IntValue``, ``BoolValue``, ``StringValue``, ``VersionValue`` (and the list forms); an unset
  field reads as its zero value, as with cel-go native types. Standard CEL functions only.

Parsing and evaluation use cel-python (``celpy``) with its interpreted runner for the whole process:
its ``CompiledRunner`` cannot call custom functions (the transpiled code names the function's module),
it breaks once any interpreted ``Environment`` exists in the process (the Lark parser is a class-level
singleton built with the first tree class), and it keeps the activation in module globals, so it is not
safe from worker threads. celpy has no type checker; :func:`compile_expression` runs our own checker
over the parse tree so that undeclared names, unknown fields and functions, mismatched literal types and
a non-bool selector fail at compile time, with the position, as they do in Kubernetes.
"""

from __future__ import annotations

import enum
import ipaddress
import itertools
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, ClassVar, cast

import celpy
import lark
import re2  # type: ignore[import-untyped]
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator, celstr

# resource.k8s.io/v1 CELSelectorExpressionMaxLength (bytes) and CELSelectorExpressionMaxCost.
MAX_EXPRESSION_BYTES = 10 * 1024
DEFAULT_COST_LIMIT = 1_000_000
# The API limits attribute strings and versions to 64 characters; semver() input is not limited,
# but nothing legitimate is longer than this.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1


class Env(enum.Enum):
    """Which variables and functions an expression may use."""

    DRA = "dra"
    FILTER = "filter"


class CelCompileError(ValueError):
    """A CEL expression is invalid: syntax, undeclared name, type mismatch, or too long."""

    def __init__(self, expression: str, reason: str, line: int | None = None, column: int | None = None):
        self.expression = expression
        self.reason = reason
        self.line = line
        self.column = column
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"CEL expression {_excerpt(expression)}: {reason}{where}")


class CelEvalError(Exception):
    """Evaluating a compiled expression for one input failed (a runtime error in Kubernetes terms)."""


def _excerpt(expression: str, limit: int = 200) -> str:
    text = expression if len(expression) <= limit else expression[:limit] + "..."
    return repr(text)


# --------------------------------------------------------------------------------------------
# Values of the Kubernetes CEL libraries.


@dataclass(frozen=True)
class Semver:
    """A semantic version 2.0.0 value (kubernetes.Semver)."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: tuple[str, ...] = ()

    def compare(self, other: Semver) -> int:
        """Semver precedence: -1, 0 or 1; build metadata is ignored."""
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if not self.pre or not other.pre:
            # A version without pre-release identifiers ranks above one with them.
            return (not self.pre) - (not other.pre)
        for a, b in zip(self.pre, other.pre, strict=False):
            if a == b:
                continue
            if isinstance(a, int) and isinstance(b, int):
                return -1 if a < b else 1
            if isinstance(a, int):
                return -1
            if isinstance(b, int):
                return 1
            return -1 if a < b else 1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(p) for p in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


_SEMVER_IDENT = re.compile(r"[0-9A-Za-z-]+\Z")


def _semver_number(text: str, what: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"invalid character(s) found in {what} number {text!r}")
    if len(text) > 1 and text[0] == "0":
        raise ValueError(f"{what} number must not contain leading zeroes {text!r}")
    return int(text)


def parse_semver(text: str) -> Semver:
    """Parse a strict semver 2.0.0 string; raises ValueError naming the problem."""
    if not text:
        raise ValueError("version string empty")
    core, plus, build_text = text.partition("+")
    core, dash, pre_text = core.partition("-")
    parts = core.split(".")
    if len(parts) != 3:
        raise ValueError(f"no Major.Minor.Patch elements found in {text!r}")
    major = _semver_number(parts[0], "major")
    minor = _semver_number(parts[1], "minor")
    patch = _semver_number(parts[2], "patch")
    pre: list[int | str] = []
    if dash:
        for ident in pre_text.split("."):
            if not ident or not _SEMVER_IDENT.match(ident):
                raise ValueError(f"invalid pre-release identifier {ident!r} in {text!r}")
            if ident.isdigit():
                if len(ident) > 1 and ident[0] == "0":
                    raise ValueError(f"pre-release number must not contain leading zeroes {ident!r}")
                pre.append(int(ident))
            else:
                pre.append(ident)
    build: list[str] = []
    if plus:
        for ident in build_text.split("."):
            if not ident or not _SEMVER_IDENT.match(ident):
                raise ValueError(f"invalid build identifier {ident!r} in {text!r}")
            build.append(ident)
    return Semver(major, minor, patch, tuple(pre), tuple(build))


def _normalize_semver(text: str) -> str:
    """The normalisation of semver(text, true): drop a leading v, leading zeroes, pad to 3 parts."""
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or not stripped[0].isdigit():
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if "+" in parts[-1] or "-" in parts[-1]:
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?\Z"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


@dataclass(frozen=True)
class Quantity:
    """A Kubernetes resource quantity (kubernetes.Quantity), kept as an exact fraction."""

    value: Fraction
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


def parse_quantity(text: str) -> Quantity:
    """Parse a quantity such as ``1Gi``, ``500m`` or ``1e3``; raises ValueError."""
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    number = Fraction(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        number *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= Fraction(10) ** _DECIMAL[suffix]
    else:
        number *= Fraction(10) ** int(suffix[1:])
    # Kubernetes keeps nano precision and rounds anything finer up.
    scaled = number * 10**9
    if scaled.denominator != 1:
        number = Fraction(math.ceil(scaled), 10**9)
    return Quantity(number, text)


def _quantity_from_value(value: Fraction) -> Quantity:
    if value.denominator == 1:
        return Quantity(value, str(value.numerator))
    return Quantity(value, f"{math.ceil(value * 10**9)}n")


@dataclass(frozen=True)
class IP:
    """An IP address (net.IP in the Kubernetes IP library)."""

    addr: ipaddress.IPv4Address | ipaddress.IPv6Address

    def __str__(self) -> str:
        return str(self.addr)


@dataclass(frozen=True)
class CIDR:
    """An IP prefix; the address keeps its host bits, as Kubernetes' cidr() does."""

    iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface

    def __str__(self) -> str:
        return str(self.iface)


def _parse_ip(text: str) -> IP:
    if "%" in text:
        raise ValueError(f"IP address with zone value is not allowed: {text!r}")
    addr = ipaddress.ip_address(text)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address is not allowed: {text!r}")
    return IP(addr)


def _parse_cidr(text: str) -> CIDR:
    if "%" in text:
        raise ValueError(f"CIDR with zone value is not allowed: {text!r}")
    if "/" not in text:
        raise ValueError(f"network address parse error during conversion from string: {text!r}")
    iface = ipaddress.ip_interface(text)
    if isinstance(iface, ipaddress.IPv6Interface) and iface.ip.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address is not allowed: {text!r}")
    return CIDR(iface)


# --------------------------------------------------------------------------------------------
# Runtime functions. celpy looks functions up by name, so one callable serves every overload of a
# name and dispatches on the argument types. A returned CELEvalError is a CEL error value; a raised
# TypeError becomes celpy's "no such overload".

_Value = Any


def _err(message: str) -> CELEvalError:
    return CELEvalError(message, ValueError, None)


def _is_num(v: _Value) -> bool:
    return isinstance(v, (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)) and not isinstance(
        v, celtypes.BoolType
    )


def _plain_num(v: _Value) -> int | float:
    return float(v) if isinstance(v, celtypes.DoubleType) else int(v)


def _cel_equal(a: _Value, b: _Value) -> bool:
    """Heterogeneous equality as cel-go has it: numbers compare by value, other type mismatches are false."""
    if _is_num(a) and _is_num(b):
        return _plain_num(a) == _plain_num(b)
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, type) or isinstance(b, type):
        # Type values (type(x), int, string...) are the value classes themselves in celpy.
        return a is b
    if isinstance(a, celtypes.BoolType) or isinstance(b, celtypes.BoolType):
        return isinstance(a, celtypes.BoolType) and isinstance(b, celtypes.BoolType) and bool(a) == bool(b)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b) == 0
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.value == b.value
    if isinstance(a, (IP, CIDR)) or isinstance(b, (IP, CIDR)):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b):
            return False
        for key, value in a.items():
            if key not in b or not _cel_equal(value, b[key]):
                return False
        return True
    for kind in (str, bytes, celtypes.TimestampType, celtypes.DurationType):
        if isinstance(a, kind) or isinstance(b, kind):
            return isinstance(a, kind) and isinstance(b, kind) and bool(a == b)
    return False


def _fn_eq(a: _Value, b: _Value) -> _Value:
    if isinstance(a, CELEvalError):
        return a
    if isinstance(b, CELEvalError):
        return b
    return celtypes.BoolType(_cel_equal(a, b))


def _fn_ne(a: _Value, b: _Value) -> _Value:
    result = _fn_eq(a, b)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(not result)


_ORDERED_KINDS: tuple[type, ...] = (
    celtypes.BoolType,
    celtypes.StringType,
    celtypes.BytesType,
    celtypes.TimestampType,
    celtypes.DurationType,
)


def _ordering(op: Callable[[Any, Any], bool], symbol: str) -> Callable[[_Value, _Value], _Value]:
    def compare(a: _Value, b: _Value) -> _Value:
        if isinstance(a, CELEvalError):
            return a
        if isinstance(b, CELEvalError):
            return b
        # Cross-type numeric comparisons are on in the Kubernetes environment (1.28+).
        if _is_num(a) and _is_num(b):
            return celtypes.BoolType(op(_plain_num(a), _plain_num(b)))
        for kind in _ORDERED_KINDS:
            if isinstance(a, kind) and isinstance(b, kind):
                return celtypes.BoolType(op(a, b))
        raise TypeError(f"no such overload: {_type_name(a)} {symbol} {_type_name(b)}")

    return compare


def _fn_conditional(cond: _Value, then: _Value, other: _Value) -> _Value:
    # celpy evaluates only the chosen branch and passes False for the other; an erroneous or
    # non-bool condition must be the result, as in cel-go.
    if isinstance(cond, CELEvalError):
        return cond
    if not isinstance(cond, celtypes.BoolType):
        raise TypeError(f"no such overload: {_type_name(cond)} ? _ : _")
    return then if cond else other


def _fn_in(item: _Value, container: _Value) -> _Value:
    if isinstance(item, CELEvalError):
        return item
    if isinstance(container, CELEvalError):
        return container
    if isinstance(container, dict):
        return celtypes.BoolType(dict.__contains__(container, item))
    if isinstance(container, list):
        return celtypes.BoolType(any(_cel_equal(item, x) for x in container))
    raise TypeError(f"no such overload: {_type_name(item)} in {_type_name(container)}")


def _type_name(v: _Value) -> str:
    names: list[tuple[type, str]] = [
        (celtypes.BoolType, "bool"),
        (celtypes.UintType, "uint"),
        (celtypes.IntType, "int"),
        (celtypes.DoubleType, "double"),
        (celtypes.StringType, "string"),
        (celtypes.BytesType, "bytes"),
        (list, "list"),
        (dict, "map"),
        (Semver, "kubernetes.Semver"),
        (Quantity, "kubernetes.Quantity"),
        (IP, "net.IP"),
        (CIDR, "net.CIDR"),
        (celtypes.TimestampType, "google.protobuf.Timestamp"),
        (celtypes.DurationType, "google.protobuf.Duration"),
    ]
    if v is None:
        return "null_type"
    for kind, name in names:
        if isinstance(v, kind):
            return name
    return type(v).__name__


def _string_arg(v: _Value, what: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{what}: expected string, got {_type_name(v)}")
    return str(v)


def _int_arg(v: _Value, what: str) -> int:
    if not isinstance(v, celtypes.IntType) or isinstance(v, celtypes.BoolType):
        raise TypeError(f"{what}: expected int, got {_type_name(v)}")
    return int(v)


def _fn_semver(text: _Value, normalize: _Value = None) -> _Value:
    raw = _string_arg(text, "semver")
    try:
        if normalize is not None and bool(normalize):
            raw = _normalize_semver(raw)
        return parse_semver(raw)
    except ValueError as ex:
        return _err(str(ex))


def _fn_is_semver(text: _Value, normalize: _Value = None) -> _Value:
    result = _fn_semver(text, normalize)
    return celtypes.BoolType(isinstance(result, Semver))


def _fn_quantity(text: _Value) -> _Value:
    try:
        return parse_quantity(_string_arg(text, "quantity"))
    except ValueError as ex:
        return _err(str(ex))


def _fn_is_quantity(text: _Value) -> _Value:
    return celtypes.BoolType(isinstance(_fn_quantity(text), Quantity))


def _three_way(a: _Value, b: _Value, name: str) -> int:
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    raise TypeError(f"no such overload: {_type_name(a)}.{name}({_type_name(b)})")


def _fn_compare_to(a: _Value, b: _Value) -> _Value:
    return celtypes.IntType(_three_way(a, b, "compareTo"))


def _fn_is_greater_than(a: _Value, b: _Value) -> _Value:
    return celtypes.BoolType(_three_way(a, b, "isGreaterThan") > 0)


def _fn_is_less_than(a: _Value, b: _Value) -> _Value:
    return celtypes.BoolType(_three_way(a, b, "isLessThan") < 0)


def _semver_part(name: str) -> Callable[[_Value], _Value]:
    def part(v: _Value) -> _Value:
        if not isinstance(v, Semver):
            raise TypeError(f"no such overload: {_type_name(v)}.{name}()")
        return celtypes.IntType(getattr(v, name))

    return part


def _quantity_arg(v: _Value, name: str) -> Quantity:
    if not isinstance(v, Quantity):
        raise TypeError(f"no such overload: {_type_name(v)}.{name}()")
    return v


def _fn_sign(v: _Value) -> _Value:
    q = _quantity_arg(v, "sign")
    return celtypes.IntType((q.value > 0) - (q.value < 0))


def _fn_as_integer(v: _Value) -> _Value:
    q = _quantity_arg(v, "asInteger")
    if q.value.denominator != 1 or not _INT64_MIN <= q.value.numerator <= _INT64_MAX:
        return _err("cannot convert value to integer")
    return celtypes.IntType(q.value.numerator)


def _fn_is_integer(v: _Value) -> _Value:
    q = _quantity_arg(v, "isInteger")
    return celtypes.BoolType(q.value.denominator == 1 and _INT64_MIN <= q.value.numerator <= _INT64_MAX)


def _fn_as_approximate_float(v: _Value) -> _Value:
    return celtypes.DoubleType(float(_quantity_arg(v, "asApproximateFloat").value))


def _quantity_operand(v: _Value, name: str) -> Fraction:
    if isinstance(v, Quantity):
        return v.value
    if isinstance(v, celtypes.IntType) and not isinstance(v, celtypes.BoolType):
        return Fraction(int(v))
    raise TypeError(f"no such overload: kubernetes.Quantity.{name}({_type_name(v)})")


def _fn_add(a: _Value, b: _Value) -> _Value:
    return _quantity_from_value(_quantity_arg(a, "add").value + _quantity_operand(b, "add"))


def _fn_sub(a: _Value, b: _Value) -> _Value:
    return _quantity_from_value(_quantity_arg(a, "sub").value - _quantity_operand(b, "sub"))


def _ascii_case(convert: Callable[[str], str]) -> Callable[[_Value], _Value]:
    def apply(v: _Value) -> _Value:
        text = _string_arg(v, "string case")
        # Only ASCII letters change, as in cel-go.
        return celtypes.StringType("".join(convert(c) if c.isascii() else c for c in text))

    return apply


def _fn_char_at(v: _Value, index: _Value) -> _Value:
    text, i = _string_arg(v, "charAt"), _int_arg(index, "charAt")
    if i < 0 or i > len(text):
        return _err(f"index out of range: {i}")
    return celtypes.StringType(text[i] if i < len(text) else "")


def _offset_search(text: str, sub: str, offset: int, search: Callable[[], int]) -> _Value:
    """indexOf/lastIndexOf from ``offset``: a negative offset is an error, an empty
    ``sub`` is found at the offset, an offset past the end finds nothing."""
    if offset < 0:
        return _err(f"index out of range: {offset}")
    if not sub:
        return celtypes.IntType(min(offset, len(text)))
    if offset >= len(text):
        return celtypes.IntType(-1)
    return celtypes.IntType(search())


def _string_index_of(text: str, sub: str, offset: int) -> _Value:
    return _offset_search(text, sub, offset, lambda: text.find(sub, offset))


def _string_last_index_of(text: str, sub: str, offset: int | None) -> _Value:
    if offset is None:
        if not sub:
            return celtypes.IntType(len(text))
        return celtypes.IntType(text.rfind(sub))
    return _offset_search(text, sub, offset, lambda: text.rfind(sub, 0, offset + len(sub)))


def _fn_index_of(target: _Value, what: _Value, offset: _Value = None) -> _Value:
    if isinstance(target, list):
        # Kubernetes lists library.
        for i, item in enumerate(target):
            if _cel_equal(item, what):
                return celtypes.IntType(i)
        return celtypes.IntType(-1)
    start = 0 if offset is None else _int_arg(offset, "indexOf")
    return _string_index_of(_string_arg(target, "indexOf"), _string_arg(what, "indexOf"), start)


def _fn_last_index_of(target: _Value, what: _Value, offset: _Value = None) -> _Value:
    if isinstance(target, list):
        for i in range(len(target) - 1, -1, -1):
            if _cel_equal(target[i], what):
                return celtypes.IntType(i)
        return celtypes.IntType(-1)
    start = None if offset is None else _int_arg(offset, "lastIndexOf")
    return _string_last_index_of(_string_arg(target, "lastIndexOf"), _string_arg(what, "lastIndexOf"), start)


def _fn_replace(v: _Value, old: _Value, new: _Value, limit: _Value = None) -> _Value:
    count = -1 if limit is None else _int_arg(limit, "replace")
    text = _string_arg(v, "replace")
    return celtypes.StringType(text.replace(_string_arg(old, "replace"), _string_arg(new, "replace"), count))


def _fn_split(v: _Value, sep: _Value, limit: _Value = None) -> _Value:
    text, separator = _string_arg(v, "split"), _string_arg(sep, "split")
    n = -1 if limit is None else _int_arg(limit, "split")
    if n == 0:
        return celtypes.ListType([])
    if separator:
        parts = text.split(separator, n - 1 if n > 0 else -1)
    else:
        # Go splits after each UTF-8 sequence when the separator is empty.
        chars = list(text)
        parts = chars if n < 0 or n >= len(chars) else [*chars[: n - 1], "".join(chars[n - 1 :])]
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _fn_substring(v: _Value, start: _Value, end: _Value = None) -> _Value:
    text, begin = _string_arg(v, "substring"), _int_arg(start, "substring")
    stop = len(text) if end is None else _int_arg(end, "substring")
    if begin > stop:
        return _err(f"invalid substring range. start: {begin}, end: {stop}")
    for i in (begin, stop):
        if i < 0 or i > len(text):
            return _err(f"index out of range: {i}")
    return celtypes.StringType(text[begin:stop])


def _fn_trim(v: _Value) -> _Value:
    return celtypes.StringType(_string_arg(v, "trim").strip())


def _fn_join(items: _Value, sep: _Value = None) -> _Value:
    if not isinstance(items, list):
        raise TypeError(f"no such overload: {_type_name(items)}.join()")
    separator = "" if sep is None else _string_arg(sep, "join")
    return celtypes.StringType(separator.join(_string_arg(i, "join") for i in items))


_RE2_OPTIONS = re2.Options()
# A bad pattern is reported as a CEL error; RE2's own stderr logging would only add noise.
_RE2_OPTIONS.log_errors = False


@lru_cache(maxsize=128)
def _regex(pattern: str) -> Any:
    return re2.compile(pattern, _RE2_OPTIONS)


def _regex_error(ex: Exception) -> str:
    detail = ex.args[0] if ex.args else ex
    return detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)


def _compile_regex(pattern: _Value) -> Any:
    try:
        return _regex(_string_arg(pattern, "regex"))
    except re2.error as ex:
        return _err(f"invalid regular expression {str(pattern)!r}: {_regex_error(ex)}")


def _fn_matches(text: _Value, pattern: _Value) -> _Value:
    regex = _compile_regex(pattern)
    if isinstance(regex, CELEvalError):
        return regex
    # RE2 partial match, as cel-go's matches().
    return celtypes.BoolType(regex.search(_string_arg(text, "matches")) is not None)


def _fn_find(text: _Value, pattern: _Value) -> _Value:
    regex = _compile_regex(pattern)
    if isinstance(regex, CELEvalError):
        return regex
    match = regex.search(_string_arg(text, "find"))
    return celtypes.StringType(match.group(0) if match else "")


def _fn_find_all(text: _Value, pattern: _Value, limit: _Value = None) -> _Value:
    regex = _compile_regex(pattern)
    if isinstance(regex, CELEvalError):
        return regex
    n = -1 if limit is None else _int_arg(limit, "findAll")
    found: list[_Value] = []
    if n != 0:
        for match in regex.finditer(_string_arg(text, "findAll")):
            found.append(celtypes.StringType(match.group(0)))
            if len(found) == n:
                break
    return celtypes.ListType(found)


def _list_arg(v: _Value, name: str) -> list[_Value]:
    if not isinstance(v, list):
        raise TypeError(f"no such overload: {_type_name(v)}.{name}()")
    return v


def _fn_is_sorted(v: _Value) -> _Value:
    items = _list_arg(v, "isSorted")
    less = _ordering(lambda x, y: x < y, "<")
    for a, b in itertools.pairwise(items):
        result = less(b, a)
        if isinstance(result, CELEvalError):
            return result
        if result:
            return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _fn_sum(v: _Value) -> _Value:
    items = _list_arg(v, "sum")
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    for item in items[1:]:
        total = total + item
    return total


def _fn_max(v: _Value) -> _Value:
    items = _list_arg(v, "max")
    if not items:
        return _err("max(list) argument must not be empty")
    greater = _ordering(lambda x, y: x > y, ">")
    best = items[0]
    for item in items[1:]:
        result = greater(item, best)
        if isinstance(result, CELEvalError):
            return result
        if result:
            best = item
    return best


def _fn_includes(target: _Value, item: _Value) -> _Value:
    if isinstance(target, list):
        return celtypes.BoolType(any(_cel_equal(x, item) for x in target))
    return celtypes.BoolType(_cel_equal(target, item))


def _sets_contains(a: _Value, b: _Value) -> _Value:
    left, right = _list_arg(a, "sets.contains"), _list_arg(b, "sets.contains")
    return celtypes.BoolType(all(any(_cel_equal(x, y) for y in left) for x in right))


def _sets_equivalent(a: _Value, b: _Value) -> _Value:
    return celtypes.BoolType(bool(_sets_contains(a, b)) and bool(_sets_contains(b, a)))


def _sets_intersects(a: _Value, b: _Value) -> _Value:
    left, right = _list_arg(a, "sets.intersects"), _list_arg(b, "sets.intersects")
    return celtypes.BoolType(any(_cel_equal(x, y) for x in left for y in right))


def _fn_ip(v: _Value) -> _Value:
    if isinstance(v, CIDR):
        return IP(v.iface.ip)
    try:
        return _parse_ip(_string_arg(v, "ip"))
    except ValueError as ex:
        return _err(f"IP Address {str(v)!r} parse error during conversion from string: {ex}")


def _fn_is_ip(v: _Value) -> _Value:
    return celtypes.BoolType(isinstance(_fn_ip(_string_arg(v, "isIP")), IP))


def _fn_cidr(v: _Value) -> _Value:
    try:
        return _parse_cidr(_string_arg(v, "cidr"))
    except ValueError as ex:
        return _err(f"network address parse error during conversion from string: {ex}")


def _fn_is_cidr(v: _Value) -> _Value:
    return celtypes.BoolType(isinstance(_fn_cidr(v), CIDR))


def _ip_arg(v: _Value, name: str) -> IP:
    if not isinstance(v, IP):
        raise TypeError(f"no such overload: {_type_name(v)}.{name}()")
    return v


def _ip_predicate(name: str, test: Callable[[Any], bool]) -> Callable[[_Value], _Value]:
    def predicate(v: _Value) -> _Value:
        return celtypes.BoolType(test(_ip_arg(v, name).addr))

    return predicate


def _fn_family(v: _Value) -> _Value:
    return celtypes.IntType(_ip_arg(v, "family").addr.version)


def _fn_contains_ip(c: _Value, other: _Value) -> _Value:
    if not isinstance(c, CIDR):
        raise TypeError(f"no such overload: {_type_name(c)}.containsIP()")
    ip = other if isinstance(other, IP) else _fn_ip(_string_arg(other, "containsIP"))
    if isinstance(ip, CELEvalError):
        return ip
    return celtypes.BoolType(ip.addr in c.iface.network)


def _fn_contains_cidr(c: _Value, other: _Value) -> _Value:
    if not isinstance(c, CIDR):
        raise TypeError(f"no such overload: {_type_name(c)}.containsCIDR()")
    sub = other if isinstance(other, CIDR) else _fn_cidr(_string_arg(other, "containsCIDR"))
    if isinstance(sub, CELEvalError):
        return sub
    outer, inner = c.iface.network, sub.iface.network
    return celtypes.BoolType(inner.version == outer.version and inner.subnet_of(outer))  # type: ignore[arg-type]


def _fn_masked(c: _Value) -> _Value:
    if not isinstance(c, CIDR):
        raise TypeError(f"no such overload: {_type_name(c)}.masked()")
    return CIDR(ipaddress.ip_interface(str(c.iface.network)))


def _fn_prefix_length(c: _Value) -> _Value:
    if not isinstance(c, CIDR):
        raise TypeError(f"no such overload: {_type_name(c)}.prefixLength()")
    return celtypes.IntType(c.iface.network.prefixlen)


def _fn_string(v: _Value) -> _Value:
    if isinstance(v, (IP, CIDR)):
        return celtypes.StringType(str(v))
    return celtypes.StringType(v)


def _fn_size(v: _Value) -> _Value:
    if isinstance(v, (str, bytes, list, dict)):
        return celtypes.IntType(len(v))
    raise TypeError(f"no such overload: size({_type_name(v)})")


# Functions every environment has (celpy's base set covers the rest of the standard library).
_STANDARD_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "_==_": _fn_eq,
    "_!=_": _fn_ne,
    "_<_": _ordering(lambda a, b: a < b, "<"),
    "_<=_": _ordering(lambda a, b: a <= b, "<="),
    "_>_": _ordering(lambda a, b: a > b, ">"),
    "_>=_": _ordering(lambda a, b: a >= b, ">="),
    "_in_": _fn_in,
    "_?_:_": _fn_conditional,
    "matches": _fn_matches,
    "size": _fn_size,
}

_KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "semver": _fn_semver,
    "isSemver": _fn_is_semver,
    "major": _semver_part("major"),
    "minor": _semver_part("minor"),
    "patch": _semver_part("patch"),
    "quantity": _fn_quantity,
    "isQuantity": _fn_is_quantity,
    "sign": _fn_sign,
    "asInteger": _fn_as_integer,
    "isInteger": _fn_is_integer,
    "asApproximateFloat": _fn_as_approximate_float,
    "add": _fn_add,
    "sub": _fn_sub,
    "compareTo": _fn_compare_to,
    "isGreaterThan": _fn_is_greater_than,
    "isLessThan": _fn_is_less_than,
    "charAt": _fn_char_at,
    "indexOf": _fn_index_of,
    "lastIndexOf": _fn_last_index_of,
    "lowerAscii": _ascii_case(str.lower),
    "upperAscii": _ascii_case(str.upper),
    "replace": _fn_replace,
    "split": _fn_split,
    "substring": _fn_substring,
    "trim": _fn_trim,
    "join": _fn_join,
    "find": _fn_find,
    "findAll": _fn_find_all,
    "isSorted": _fn_is_sorted,
    "sum": _fn_sum,
    "max": _fn_max,
    "includes": _fn_includes,
    "ip": _fn_ip,
    "isIP": _fn_is_ip,
    "cidr": _fn_cidr,
    "isCIDR": _fn_is_cidr,
    "family": _fn_family,
    "isUnspecified": _ip_predicate("isUnspecified", lambda a: a.is_unspecified),
    "isLoopback": _ip_predicate("isLoopback", lambda a: a.is_loopback),
    "isLinkLocalMulticast": _ip_predicate(
        "isLinkLocalMulticast",
        lambda a: a in ipaddress.ip_network("224.0.0.0/24" if a.version == 4 else "ff02::/16"),
    ),
    "isLinkLocalUnicast": _ip_predicate("isLinkLocalUnicast", lambda a: a.is_link_local),
    "isGlobalUnicast": _ip_predicate(
        "isGlobalUnicast",
        lambda a: (
            not (a.is_unspecified or a.is_loopback or a.is_multicast or a.is_link_local)
            and a != ipaddress.IPv4Address("255.255.255.255")
        ),
    ),
    "containsIP": _fn_contains_ip,
    "containsCIDR": _fn_contains_cidr,
    "masked": _fn_masked,
    "prefixLength": _fn_prefix_length,
    "string": _fn_string,
}

# Namespaced functions: `sets.contains(a, b)` parses as a method call on an identifier.
_NAMESPACED_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {
    ("sets", "contains"): _sets_contains,
    ("sets", "equivalent"): _sets_equivalent,
    ("sets", "intersects"): _sets_intersects,
}


# --------------------------------------------------------------------------------------------
# Compile-time checker over celpy's parse tree.


@dataclass(frozen=True)
class _T:
    kind: str
    params: tuple[_T, ...] = ()
    name: str = ""

    def __str__(self) -> str:
        if self.kind == "list":
            return f"list({self.params[0]})"
        if self.kind == "map":
            return f"map({self.params[0]}, {self.params[1]})"
        if self.kind == "object":
            return self.name
        return self.kind


DYN = _T("dyn")
BOOL, INT, UINT, DOUBLE = _T("bool"), _T("int"), _T("uint"), _T("double")
STRING, BYTES, NULL, TYPE = _T("string"), _T("bytes"), _T("null_type"), _T("type")
TIMESTAMP, DURATION = _T("google.protobuf.Timestamp"), _T("google.protobuf.Duration")
SEMVER, QUANTITY = _T("kubernetes.Semver"), _T("kubernetes.Quantity")
IPT, CIDRT = _T("net.IP"), _T("net.CIDR")


def _list(t: _T) -> _T:
    return _T("list", (t,))


def _map(k: _T, v: _T) -> _T:
    return _T("map", (k, v))


LIST_DYN, MAP_DYN = _list(DYN), _map(DYN, DYN)
_NUMERIC = frozenset({"int", "uint", "double"})
_DRA_DEVICE = _T("object", name="kubernetes.DRADevice")
_NATIVE_ATTRIBUTE = _T("object", name="v1.DeviceAttribute")
_OBJECT_FIELDS: dict[str, dict[str, _T]] = {
    _DRA_DEVICE.name: {
        "driver": STRING,
        "allowMultipleAllocations": BOOL,
        "attributes": _map(STRING, _map(STRING, DYN)),
        "capacity": _map(STRING, _map(STRING, QUANTITY)),
    },
    _NATIVE_ATTRIBUTE.name: {
        "IntValue": INT,
        "BoolValue": BOOL,
        "StringValue": STRING,
        "VersionValue": STRING,
        "IntValues": _list(INT),
        "BoolValues": _list(BOOL),
        "StringValues": _list(STRING),
        "VersionValues": _list(STRING),
    },
}
_TYPE_NAMES = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
)
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_NAMESPACES = frozenset({"cel", "sets"})


@dataclass(frozen=True)
class _Overload:
    receiver: _T | None
    params: tuple[_T, ...]
    result: _T


def _g(params: Sequence[_T], result: _T) -> _Overload:
    return _Overload(None, tuple(params), result)


def _m(receiver: _T, params: Sequence[_T], result: _T) -> _Overload:
    return _Overload(receiver, tuple(params), result)


_STANDARD_DECLS: dict[str, list[_Overload]] = {
    "size": [_g([t], INT) for t in (STRING, BYTES, LIST_DYN, MAP_DYN)]
    + [_m(t, [], INT) for t in (STRING, BYTES, LIST_DYN, MAP_DYN)],
    "contains": [_m(STRING, [STRING], BOOL)],
    "startsWith": [_m(STRING, [STRING], BOOL)],
    "endsWith": [_m(STRING, [STRING], BOOL)],
    "matches": [_m(STRING, [STRING], BOOL), _g([STRING, STRING], BOOL)],
    "int": [_g([t], INT) for t in (INT, UINT, DOUBLE, STRING, TIMESTAMP)],
    "uint": [_g([t], UINT) for t in (INT, UINT, DOUBLE, STRING)],
    "double": [_g([t], DOUBLE) for t in (INT, UINT, DOUBLE, STRING)],
    "string": [_g([t], STRING) for t in (INT, UINT, DOUBLE, BOOL, STRING, BYTES, TIMESTAMP, DURATION)],
    "bool": [_g([t], BOOL) for t in (BOOL, STRING)],
    "bytes": [_g([t], BYTES) for t in (BYTES, STRING)],
    "dyn": [_g([DYN], DYN)],
    "type": [_g([DYN], TYPE)],
    "timestamp": [_g([STRING], TIMESTAMP), _g([TIMESTAMP], TIMESTAMP)],
    "duration": [_g([STRING], DURATION), _g([DURATION], DURATION)],
}

_KUBERNETES_DECLS: dict[str, list[_Overload]] = {
    "semver": [_g([STRING], SEMVER), _g([STRING, BOOL], SEMVER)],
    "isSemver": [_g([STRING], BOOL), _g([STRING, BOOL], BOOL)],
    "major": [_m(SEMVER, [], INT)],
    "minor": [_m(SEMVER, [], INT)],
    "patch": [_m(SEMVER, [], INT)],
    "quantity": [_g([STRING], QUANTITY)],
    "isQuantity": [_g([STRING], BOOL)],
    "sign": [_g([QUANTITY], INT)],
    "asInteger": [_m(QUANTITY, [], INT)],
    "isInteger": [_m(QUANTITY, [], BOOL)],
    "asApproximateFloat": [_m(QUANTITY, [], DOUBLE)],
    "add": [_m(QUANTITY, [QUANTITY], QUANTITY), _m(QUANTITY, [INT], QUANTITY)],
    "sub": [_m(QUANTITY, [QUANTITY], QUANTITY), _m(QUANTITY, [INT], QUANTITY)],
    "compareTo": [_m(SEMVER, [SEMVER], INT), _m(QUANTITY, [QUANTITY], INT)],
    "isGreaterThan": [_m(SEMVER, [SEMVER], BOOL), _m(QUANTITY, [QUANTITY], BOOL)],
    "isLessThan": [_m(SEMVER, [SEMVER], BOOL), _m(QUANTITY, [QUANTITY], BOOL)],
    "charAt": [_m(STRING, [INT], STRING)],
    "indexOf": [_m(STRING, [STRING], INT), _m(STRING, [STRING, INT], INT), _m(LIST_DYN, [DYN], INT)],
    "lastIndexOf": [_m(STRING, [STRING], INT), _m(STRING, [STRING, INT], INT), _m(LIST_DYN, [DYN], INT)],
    "lowerAscii": [_m(STRING, [], STRING)],
    "upperAscii": [_m(STRING, [], STRING)],
    "replace": [_m(STRING, [STRING, STRING], STRING), _m(STRING, [STRING, STRING, INT], STRING)],
    "split": [_m(STRING, [STRING], _list(STRING)), _m(STRING, [STRING, INT], _list(STRING))],
    "substring": [_m(STRING, [INT], STRING), _m(STRING, [INT, INT], STRING)],
    "trim": [_m(STRING, [], STRING)],
    "join": [_m(_list(STRING), [], STRING), _m(_list(STRING), [STRING], STRING)],
    "find": [_m(STRING, [STRING], STRING)],
    "findAll": [_m(STRING, [STRING], _list(STRING)), _m(STRING, [STRING, INT], _list(STRING))],
    "isSorted": [_m(LIST_DYN, [], BOOL)],
    "sum": [_m(LIST_DYN, [], DYN)],
    "min": [_m(LIST_DYN, [], DYN)],
    "max": [_m(LIST_DYN, [], DYN)],
    "includes": [_m(DYN, [DYN], BOOL)],
    "ip": [_g([STRING], IPT), _m(CIDRT, [], IPT)],
    "isIP": [_g([STRING], BOOL)],
    "cidr": [_g([STRING], CIDRT)],
    "isCIDR": [_g([STRING], BOOL)],
    "family": [_m(IPT, [], INT)],
    "isUnspecified": [_m(IPT, [], BOOL)],
    "isLoopback": [_m(IPT, [], BOOL)],
    "isLinkLocalMulticast": [_m(IPT, [], BOOL)],
    "isLinkLocalUnicast": [_m(IPT, [], BOOL)],
    "isGlobalUnicast": [_m(IPT, [], BOOL)],
    "containsIP": [_m(CIDRT, [IPT], BOOL), _m(CIDRT, [STRING], BOOL)],
    "containsCIDR": [_m(CIDRT, [CIDRT], BOOL), _m(CIDRT, [STRING], BOOL)],
    "masked": [_m(CIDRT, [], CIDRT)],
    "prefixLength": [_m(CIDRT, [], INT)],
    "string": [_g([IPT], STRING), _g([CIDRT], STRING)],
}

_NAMESPACED_DECLS: dict[tuple[str, str], list[_Overload]] = {
    ("sets", "contains"): [_g([LIST_DYN, LIST_DYN], BOOL)],
    ("sets", "equivalent"): [_g([LIST_DYN, LIST_DYN], BOOL)],
    ("sets", "intersects"): [_g([LIST_DYN, LIST_DYN], BOOL)],
}


@dataclass(frozen=True)
class _EnvSpec:
    variables: Mapping[str, _T]
    decls: Mapping[str, list[_Overload]]
    namespaced: Mapping[tuple[str, str], list[_Overload]]
    functions: Mapping[str, Callable[..., Any]]
    cross_type_numeric: bool
    homogeneous_literals: bool
    bindings: bool
    require_bool: bool


def _merge_decls(*tables: Mapping[str, list[_Overload]]) -> dict[str, list[_Overload]]:
    merged: dict[str, list[_Overload]] = {}
    for table in tables:
        for name, overloads in table.items():
            merged.setdefault(name, []).extend(overloads)
    return merged


_ENVS: dict[Env, _EnvSpec] = {
    Env.DRA: _EnvSpec(
        variables={"device": _DRA_DEVICE},
        decls=_merge_decls(_STANDARD_DECLS, _KUBERNETES_DECLS),
        namespaced=_NAMESPACED_DECLS,
        functions={**_STANDARD_FUNCTIONS, **_KUBERNETES_FUNCTIONS},
        cross_type_numeric=True,
        homogeneous_literals=True,
        bindings=True,
        require_bool=True,
    ),
    # dranet builds this one with a bare cel.NewEnv plus native types: no extensions.
    Env.FILTER: _EnvSpec(
        variables={"attributes": _map(STRING, _NATIVE_ATTRIBUTE)},
        decls=_STANDARD_DECLS,
        namespaced={},
        functions=_STANDARD_FUNCTIONS,
        cross_type_numeric=False,
        homogeneous_literals=False,
        bindings=False,
        require_bool=False,
    ),
}


class _CheckError(Exception):
    def __init__(self, reason: str, node: lark.Tree | lark.Token | None):
        super().__init__(reason)
        self.reason = reason
        self.node = node


def _position(node: lark.Tree | lark.Token | None) -> tuple[int | None, int | None]:
    if isinstance(node, lark.Token):
        return node.line, node.column
    if isinstance(node, lark.Tree) and not node.meta.empty:
        return node.meta.line, node.meta.column
    return None, None


def _accepts(param: _T, arg: _T) -> bool:
    if param.kind == "dyn" or arg.kind == "dyn":
        return True
    if param.kind != arg.kind or param.name != arg.name:
        return False
    return all(_accepts(p, a) for p, a in zip(param.params, arg.params, strict=True))


def _join_types(a: _T, b: _T) -> _T:
    if a == b:
        return a
    if a.kind == "null_type":
        return b
    if b.kind == "null_type":
        return a
    return DYN


def _single_child(tree: lark.Tree) -> lark.Tree | None:
    """Follow a chain of one-child rule nodes down to the first node that does something."""
    node: Any = tree
    while isinstance(node, lark.Tree) and len(node.children) == 1 and node.data in _PASS_THROUGH:
        node = node.children[0]
    return node if isinstance(node, lark.Tree) else None


_PASS_THROUGH = frozenset(
    {
        "expr",
        "conditionalor",
        "conditionaland",
        "relation",
        "addition",
        "multiplication",
        "unary",
        "member",
        "primary",
    }
)


def _simple_ident(tree: lark.Tree) -> str | None:
    node = _single_child(tree)
    if node is not None and node.data == "ident":
        return str(node.children[0])
    return None


class _Checker:
    def __init__(self, spec: _EnvSpec, source: str):
        self.spec = spec
        self.source = source

    def _operator(self, left: lark.Tree, right: lark.Tree, symbol: str) -> lark.Token | lark.Tree:
        """Where a binary operator sits (the parse tree keeps no operator tokens), for error positions."""
        end = None if left.meta.empty else getattr(left.meta, "end_pos", None)
        start = None if right.meta.empty else getattr(right.meta, "start_pos", None)
        if end is None or start is None:
            return right if end is None else left
        gap = self.source[end:start]
        offset = gap.find(symbol)
        if offset < 0:
            return right
        index = end + offset
        line = self.source.count("\n", 0, index) + 1
        column = index - (self.source.rfind("\n", 0, index) + 1) + 1
        return lark.Token("OPERATOR", symbol, start_pos=index, line=line, column=column)

    def check(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        handler = getattr(self, "_" + tree.data, None)
        if handler is None:
            raise _CheckError(f"unsupported construct {tree.data}", tree)
        return cast(_T, handler(tree, scope))

    def _expr(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        if len(tree.children) == 1:
            return self.check(tree.children[0], scope)
        cond, then, other = tree.children
        self._require_bool(self.check(cond, scope), cond, "_?_:_")
        return _join_types(self.check(then, scope), self.check(other, scope))

    def _require_bool(self, t: _T, node: lark.Tree, op: str) -> None:
        if t.kind not in ("bool", "dyn"):
            raise _CheckError(f"found no matching overload for '{op}' applied to '({t})'", node)

    def _logical(self, tree: lark.Tree, scope: Mapping[str, _T], op: str) -> _T:
        if len(tree.children) == 1:
            return self.check(tree.children[0], scope)
        left = self.check(tree.children[0], scope)
        right = self.check(tree.children[1], scope)
        if left.kind not in ("bool", "dyn") or right.kind not in ("bool", "dyn"):
            where = self._operator(tree.children[0], tree.children[1], op.strip("_"))
            raise _CheckError(f"found no matching overload for '{op}' applied to '({left}, {right})'", where)
        return BOOL

    def _conditionalor(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self._logical(tree, scope, "_||_")

    def _conditionaland(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self._logical(tree, scope, "_&&_")

    def _relation(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        if len(tree.children) == 1:
            return self.check(tree.children[0], scope)
        op_node, right_node = tree.children
        left = self.check(op_node.children[0], scope)
        right = self.check(right_node, scope)
        op = op_node.data
        symbol = {
            "relation_lt": "_<_",
            "relation_le": "_<=_",
            "relation_gt": "_>_",
            "relation_ge": "_>=_",
            "relation_eq": "_==_",
            "relation_ne": "_!=_",
            "relation_in": "@in",
        }[op]
        mismatch = _CheckError(
            f"found no matching overload for '{symbol}' applied to '({left}, {right})'",
            self._operator(op_node.children[0], right_node, symbol.strip("_@")),
        )
        if op in ("relation_eq", "relation_ne"):
            if not (_accepts(left, right) or NULL in (left, right)):
                raise mismatch
        elif op == "relation_in":
            if right.kind == "list":
                ok = _accepts(right.params[0], left)
            elif right.kind == "map":
                ok = _accepts(right.params[0], left)
            else:
                ok = right.kind == "dyn"
            if not ok:
                raise mismatch
        else:
            ordered = {"int", "uint", "double", "string", "bytes", "bool", TIMESTAMP.kind, DURATION.kind}
            if left.kind == "dyn" or right.kind == "dyn":
                pass
            elif left.kind in _NUMERIC and right.kind in _NUMERIC:
                if left.kind != right.kind and not self.spec.cross_type_numeric:
                    raise mismatch
            elif left != right or left.kind not in ordered:
                raise mismatch
        return BOOL

    def _arith(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        if len(tree.children) == 1:
            return self.check(tree.children[0], scope)
        op_node, right_node = tree.children
        left = self.check(op_node.children[0], scope)
        right = self.check(right_node, scope)
        op = op_node.data.split("_", 1)[1]
        symbol = {"add": "_+_", "sub": "_-_", "mul": "_*_", "div": "_/_", "mod": "_%_"}[op]
        if left.kind == "dyn" or right.kind == "dyn":
            return (
                left if right.kind == "dyn" and left.kind != "dyn" else right if left.kind == "dyn" else DYN
            )
        allowed = {
            "add": {"int", "uint", "double", "string", "bytes", "list", DURATION.kind},
            "sub": {"int", "uint", "double", DURATION.kind},
            "mul": {"int", "uint", "double"},
            "div": {"int", "uint", "double"},
            "mod": {"int", "uint"},
        }[op]
        if left.kind == right.kind and left.kind in allowed:
            if left.kind == "list":
                return left if left == right else LIST_DYN
            return left
        if op == "add" and {left.kind, right.kind} == {TIMESTAMP.kind, DURATION.kind}:
            return TIMESTAMP
        if op == "sub" and left.kind == TIMESTAMP.kind and right.kind in (TIMESTAMP.kind, DURATION.kind):
            return DURATION if right.kind == TIMESTAMP.kind else TIMESTAMP
        raise _CheckError(
            f"found no matching overload for '{symbol}' applied to '({left}, {right})'",
            self._operator(op_node.children[0], right_node, symbol.strip("_")),
        )

    def _addition(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self._arith(tree, scope)

    def _multiplication(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self._arith(tree, scope)

    def _unary(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        if len(tree.children) == 1:
            return self.check(tree.children[0], scope)
        op, operand_node = tree.children
        operand = self.check(operand_node, scope)
        if op.data == "unary_not":
            self._require_bool(operand, tree, "!_")
            return BOOL
        if operand.kind not in ("int", "double", "dyn", DURATION.kind):
            raise _CheckError(f"found no matching overload for '-_' applied to '({operand})'", tree)
        return operand

    def _member(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self.check(tree.children[0], scope)

    def _primary(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self.check(tree.children[0], scope)

    def _paren_expr(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self.check(tree.children[0], scope)

    def _select(self, operand: _T, name: str, node: lark.Tree | lark.Token) -> _T:
        if operand.kind == "object":
            fields = _OBJECT_FIELDS[operand.name]
            if name not in fields:
                raise _CheckError(f"undefined field '{name}'", node)
            return fields[name]
        if operand.kind == "map":
            if not _accepts(operand.params[0], STRING):
                raise _CheckError(f"type '{operand}' does not support field selection", node)
            return operand.params[1]
        if operand.kind == "dyn":
            return DYN
        raise _CheckError(f"type '{operand}' does not support field selection", node)

    def _member_dot(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        operand_node, name = tree.children
        return self._select(self.check(operand_node, scope), str(name), name)

    def _member_index(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        operand = self.check(tree.children[0], scope)
        index = self.check(tree.children[1], scope)
        if operand.kind == "list" and index.kind in ("int", "uint", "dyn"):
            return operand.params[0]
        if operand.kind == "map" and _accepts(operand.params[0], index):
            return operand.params[1]
        if operand.kind == "dyn":
            return DYN
        raise _CheckError(f"found no matching overload for '_[_]' applied to '({operand}, {index})'", tree)

    def _member_object(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        raise _CheckError("message construction is not supported", tree)

    def _args(self, tree: lark.Tree | None, scope: Mapping[str, _T]) -> list[_T]:
        if tree is None:
            return []
        return [self.check(child, scope) for child in tree.children]

    def _resolve(
        self,
        name: str,
        overloads: list[_Overload],
        receiver: _T | None,
        args: list[_T],
        node: lark.Tree | lark.Token,
    ) -> _T:
        results = []
        for overload in overloads:
            if (overload.receiver is None) != (receiver is None) or len(overload.params) != len(args):
                continue
            if (
                receiver is not None
                and overload.receiver is not None
                and not _accepts(overload.receiver, receiver)
            ):
                continue
            if all(_accepts(p, a) for p, a in zip(overload.params, args, strict=True)):
                results.append(overload.result)
        if not results:
            shown = ", ".join(str(a) for a in args)
            target = f"{receiver}." if receiver is not None else ""
            raise _CheckError(f"found no matching overload for '{name}' applied to '{target}({shown})'", node)
        first = results[0]
        return first if all(r == first for r in results) else DYN

    def _member_dot_arg(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        operand_node, name_token = tree.children[:2]
        args_tree = tree.children[2] if len(tree.children) == 3 else None
        name = str(name_token)
        namespace = _simple_ident(operand_node)
        if namespace in _NAMESPACES and namespace not in scope and namespace not in self.spec.variables:
            if namespace == "cel" and name == "bind" and self.spec.bindings:
                return self._bind(tree, args_tree, scope)
            key = (namespace, name)
            if key in self.spec.namespaced:
                return self._resolve(
                    f"{namespace}.{name}",
                    self.spec.namespaced[key],
                    None,
                    self._args(args_tree, scope),
                    name_token,
                )
            raise _CheckError(f"undeclared reference to '{namespace}.{name}'", name_token)
        operand = self.check(operand_node, scope)
        if name in _MACROS:
            return self._macro(name, operand, args_tree, scope, tree)
        overloads = self.spec.decls.get(name)
        if not overloads:
            # celpy's own reduce() extension is not CEL; refuse it like any unknown name.
            raise _CheckError(f"undeclared reference to '{name}'", name_token)
        return self._resolve(name, overloads, operand, self._args(args_tree, scope), name_token)

    def _macro_var(self, node: lark.Tree, macro: str) -> str:
        var = _simple_ident(node)
        if var is None:
            raise _CheckError(f"{macro}() variable name must be a simple identifier", node)
        return var

    def _macro(
        self, name: str, target: _T, args_tree: lark.Tree | None, scope: Mapping[str, _T], node: lark.Tree
    ) -> _T:
        args = args_tree.children if args_tree is not None else []
        if name == "map" and len(args) == 3:
            raise _CheckError("the three-argument map() macro is not supported by this evaluator", node)
        if len(args) != 2:
            raise _CheckError(f"{name}() takes a variable and an expression", node)
        var = self._macro_var(args[0], name)
        if target.kind == "list":
            element = target.params[0]
        elif target.kind == "map":
            element = target.params[0]
        elif target.kind == "dyn":
            element = DYN
        else:
            raise _CheckError(f"{name}() cannot range over '{target}'", node)
        body = self.check(args[1], {**scope, var: element})
        if name in ("all", "exists", "exists_one", "filter"):
            self._require_bool(body, args[1], name)
            return _list(element) if name == "filter" else BOOL
        return _list(body)

    def _bind(self, tree: lark.Tree, args_tree: lark.Tree | None, scope: Mapping[str, _T]) -> _T:
        args = args_tree.children if args_tree is not None else []
        if len(args) != 3:
            raise _CheckError("cel.bind() takes a variable, an initializer and an expression", tree)
        var = self._macro_var(args[0], "cel.bind")
        init = self.check(args[1], scope)
        return self.check(args[2], {**scope, var: init})

    def _ident_arg(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        name = str(tree.children[0])
        args_tree = tree.children[1] if len(tree.children) == 2 else None
        if name == "has":
            return self._has(args_tree, scope, tree)
        if name == "dyn":
            args = self._args(args_tree, scope)
            if len(args) != 1:
                raise _CheckError("dyn() takes one argument", tree)
            return DYN
        overloads = self.spec.decls.get(name)
        if not overloads:
            raise _CheckError(f"undeclared reference to '{name}'", tree.children[0])
        return self._resolve(name, overloads, None, self._args(args_tree, scope), tree.children[0])

    def _dot_ident_arg(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self._ident_arg(tree, scope)

    def _has(self, args_tree: lark.Tree | None, scope: Mapping[str, _T], node: lark.Tree) -> _T:
        args = args_tree.children if args_tree is not None else []
        target = _single_child(args[0]) if len(args) == 1 else None
        if target is None or target.data != "member_dot":
            raise _CheckError("invalid argument to has() macro", node)
        self._member_dot(target, scope)
        return BOOL

    def _ident(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        name = str(tree.children[0])
        if name in scope:
            return scope[name]
        if name in self.spec.variables:
            return self.spec.variables[name]
        if name in _TYPE_NAMES:
            return TYPE
        raise _CheckError(f"undeclared reference to '{name}'", tree.children[0])

    def _dot_ident(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self._ident(tree, {})

    def _list_lit(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        elements = self._args(tree.children[0] if tree.children else None, scope)
        return _list(self._homogeneous(elements, tree))

    def _homogeneous(self, types: list[_T], node: lark.Tree) -> _T:
        known = [t for t in types if t.kind != "dyn"]
        if not known:
            return DYN
        first = known[0]
        for t in known[1:]:
            if not _accepts(first, t):
                if self.spec.homogeneous_literals:
                    raise _CheckError(f"expected type '{first}' but found '{t}'", node)
                return DYN
        return first if len(known) == len(types) else DYN

    def _map_lit(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        items = self._args(tree.children[0] if tree.children else None, scope)
        keys, values = items[0::2], items[1::2]
        for k in keys:
            if k.kind not in ("int", "uint", "bool", "string", "dyn"):
                raise _CheckError(f"unsupported map key type '{k}'", tree)
        return _map(self._homogeneous(keys, tree), self._homogeneous(values, tree))

    def _literal(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        token = cast(lark.Token, tree.children[0])
        kind = token.type
        text = str(token)
        if kind == "INT_LIT":
            value = int(text, 16) if "0x" in text.lower() else int(text)
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise _CheckError(f"invalid int literal {text}", tree)
            return INT
        if kind == "UINT_LIT":
            digits = text[:-1]
            value = int(digits, 16) if "0x" in digits.lower() else int(digits)
            if not 0 <= value <= _UINT64_MAX:
                raise _CheckError(f"invalid uint literal {text}", tree)
            return UINT
        if kind == "FLOAT_LIT":
            return DOUBLE
        if kind in ("STRING_LIT", "MLSTRING_LIT"):
            try:
                celstr(token)
            except ValueError as ex:
                raise _CheckError(f"invalid string literal: {ex}", tree) from None
            return STRING
        if kind == "BYTES_LIT":
            return BYTES
        if kind == "BOOL_LIT":
            return BOOL
        if kind == "NULL_LIT":
            return NULL
        raise _CheckError(f"unsupported literal {text}", tree)


_REGEX_FUNCTIONS = frozenset({"matches", "find", "findAll"})


def _validate_regex_literals(tree: lark.Tree) -> None:
    """Reject a literal pattern RE2 cannot compile, as Kubernetes' ValidateRegexLiterals does."""
    for node in tree.iter_subtrees():
        if (
            node.data == "member_dot_arg"
            and len(node.children) == 3
            and str(node.children[1]) in _REGEX_FUNCTIONS
        ):
            pattern_node = node.children[2].children[0] if node.children[2].children else None
        elif node.data == "ident_arg" and str(node.children[0]) == "matches" and len(node.children) == 2:
            args = node.children[1].children
            pattern_node = args[1] if len(args) == 2 else None
        else:
            continue
        literal = _single_child(pattern_node) if pattern_node is not None else None
        if (
            literal is None
            or literal.data != "literal"
            or cast(lark.Token, literal.children[0]).type not in ("STRING_LIT", "MLSTRING_LIT")
        ):
            continue
        pattern = str(celstr(cast(lark.Token, literal.children[0])))
        try:
            _regex(pattern)
        except re2.error as ex:
            raise _CheckError(
                f"invalid regular expression {pattern!r}: {_regex_error(ex)}", literal
            ) from None


# --------------------------------------------------------------------------------------------
# Evaluation.


# Rule nodes whose celpy handler, with one child, only returns that child's value. `primary` is
# not among them: its handler dispatches on the child's rule.
_COLLAPSIBLE = frozenset(
    {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member"}
)


def _collapse(tree: lark.Tree) -> lark.Tree:
    """A copy of the parse tree without single-child pass-through chains.

    The grammar nests every leaf about nine rules deep; the interpreter spends most of its time
    walking those chains, so removing them roughly doubles evaluation speed without changing meaning.
    """
    children = [_collapse(c) if isinstance(c, lark.Tree) else c for c in tree.children]
    if tree.data in _COLLAPSIBLE and len(children) == 1 and isinstance(children[0], lark.Tree):
        return children[0]
    return lark.Tree(tree.data, children, tree.meta)


class _CostExceeded(Exception):
    pass


@dataclass
class _Budget:
    limit: int
    deadline: float | None
    steps: int = 0


class _DefaultingMap(celtypes.MapType):
    """device.attributes / device.capacity: an unknown domain reads as an empty map (Kubernetes'
    mapper with a default), while `in`, has() and size() still see only the real keys."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


class _NativeStruct(celtypes.MapType):
    """A Go struct seen through cel-go native types: holds the set fields; an unset one reads as
    its zero value (has() is false for it)."""

    ZEROS: ClassVar[Mapping[str, Callable[[], Any]]] = {}

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            zero = self.ZEROS.get(key)
            if zero is None:
                raise
            return zero()


class _Evaluator(Evaluator):
    """celpy's interpreter plus cel.bind, namespaced functions, faithful has(), and a step budget."""

    def __init__(self, ast: lark.Tree, activation: Any, budget: _Budget):
        super().__init__(ast, activation)
        self._budget = budget

    def sub_evaluator(self, ast: lark.Tree) -> _Evaluator:
        return _Evaluator(ast, self.activation, self._budget)

    def _visit_tree(self, tree: lark.Tree) -> Any:
        budget = self._budget
        budget.steps += 1
        if budget.steps > budget.limit:
            raise _CostExceeded("operation cancelled: actual cost limit exceeded")
        if budget.deadline is not None and budget.steps % 256 == 0 and time.monotonic() > budget.deadline:
            raise _CostExceeded("operation cancelled: evaluation time limit exceeded")
        return super()._visit_tree(tree)

    def member_dot_arg(self, tree: lark.Tree) -> Any:
        namespace = _simple_ident(tree.children[0])
        name = str(tree.children[1])
        if namespace in _NAMESPACES and not self._is_variable(namespace):
            args = tree.children[2].children if len(tree.children) == 3 else []
            if namespace == "cel" and name == "bind":
                return self._bind(args)
            function = _NAMESPACED_FUNCTIONS.get((namespace, name))
            if function is not None:
                values = [self.visit(a) for a in args]
                for v in values:
                    if isinstance(v, CELEvalError):
                        return v
                try:
                    return function(*values)
                except TypeError as ex:
                    return CELEvalError(f"no such overload: {ex}", TypeError, None, tree=tree)
        if name in ("all", "exists", "exists_one") and len(tree.children) == 3:
            return self._quantifier(name, tree.children[0], tree.children[2].children)
        return super().member_dot_arg(tree)

    def _quantifier(self, name: str, target_tree: lark.Tree, args: list[Any]) -> Any:
        """all/exists/exists_one as cel-go has them: a decisive element wins over errors from
        other elements; otherwise the first error is the result (celpy would nest the errors)."""
        target = self.visit(target_tree)
        if isinstance(target, CELEvalError):
            return target
        if not isinstance(target, (list, dict)):
            return CELEvalError(f"{name}() cannot range over {_type_name(target)}", TypeError, None)
        var = cast(str, _simple_ident(args[0]))
        body = self.sub_evaluator(args[1])
        first_error: CELEvalError | None = None
        count = 0
        for item in list(target):
            result: Any
            try:
                result = body.evaluate({var: item})
            except CELEvalError as ex:
                result = ex
            if not isinstance(result, celtypes.BoolType):
                error = (
                    result
                    if isinstance(result, CELEvalError)
                    else CELEvalError(f"{name}() predicate returned {_type_name(result)}", TypeError, None)
                )
                if name == "exists_one":
                    return error
                first_error = first_error or error
                continue
            if name == "exists" and result:
                return celtypes.BoolType(True)
            if name == "all" and not result:
                return celtypes.BoolType(False)
            count += bool(result)
        if first_error is not None:
            return first_error
        if name == "exists_one":
            return celtypes.BoolType(count == 1)
        return celtypes.BoolType(name == "all")

    def _is_variable(self, name: str) -> bool:
        try:
            self.activation.resolve_variable(name)
        except KeyError:
            return False
        return True

    def _bind(self, args: list[Any]) -> Any:
        var = _simple_ident(args[0])
        init = self.visit(args[1])
        if isinstance(init, CELEvalError):
            return init
        try:
            return self.sub_evaluator(args[2]).evaluate({cast(str, var): init})
        except CELEvalError as ex:
            return ex

    def macro_has_eval(self, exprlist: lark.Tree) -> Any:
        target = _single_child(exprlist.children[0])
        if target is None or target.data != "member_dot":
            return super().macro_has_eval(exprlist)
        operand = self.visit(target.children[0])
        name = str(target.children[1])
        if isinstance(operand, CELEvalError):
            return operand
        if isinstance(operand, dict):
            return celtypes.BoolType(dict.__contains__(operand, name))
        return CELEvalError(f"type '{_type_name(operand)}' does not support field selection", TypeError, None)


class _Runner(celpy.InterpretedRunner):
    def __init__(self, environment: celpy.Environment, ast: lark.Tree, functions: Mapping[str, Any]):
        super().__init__(environment, ast, dict(functions))
        # Built once; each evaluation clones it when it loads the variables.
        self._activation = self.new_activation()

    def run(self, variables: Mapping[str, Any], budget: _Budget) -> Any:
        return _Evaluator(self.ast, self._activation, budget).evaluate(dict(variables))


_CELPY_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")
_CEL_TYPE_NAMES = {
    "IntType": "int",
    "UintType": "uint",
    "DoubleType": "double",
    "BoolType": "bool",
    "StringType": "string",
    "BytesType": "bytes",
    "ListType": "list",
    "MapType": "map",
    "NoneType": "null_type",
    "CELEvalError": "error",
    "Semver": "kubernetes.Semver",
    "Quantity": "kubernetes.Quantity",
}


def _describe(error: CELEvalError) -> str:
    """A short message: celpy's own may carry Python class reprs or the whole activation."""
    message = str(error.args[0]) if error.args else "evaluation error"
    message = _CELPY_CLASS.sub(lambda m: _CEL_TYPE_NAMES.get(m.group(1), m.group(1)), message)
    detail = error.args[2] if len(error.args) > 2 else None
    if message.startswith("no such member in mapping: "):
        return "no such key: " + message.removeprefix("no such member in mapping: ").strip("'")
    if message == "no such key" and detail:
        return f"no such key: {detail[0]}"
    if message in ("no such overload", "return error for overflow", "match error") and detail:
        return f"{message}: {detail[0]}"
    if message.startswith("undeclared reference"):
        # celpy appends the whole activation; the name is enough.
        return message.split(" (in activation", 1)[0]
    return message


@dataclass(frozen=True)
class CompiledExpression:
    """A checked, ready-to-run CEL expression. Safe to share between threads."""

    expression: str
    env: Env
    cost_limit: int
    _runner: _Runner = field(repr=False, compare=False)

    def evaluate(self, variables: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """Evaluate against prepared variables (see :func:`dra_device_variables`); raise CelEvalError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        budget = _Budget(self.cost_limit, deadline)
        try:
            return self._runner.run(variables, budget)
        except CELEvalError as ex:
            raise CelEvalError(_describe(ex)) from None
        except _CostExceeded as ex:
            raise CelEvalError(str(ex)) from None
        except RecursionError:
            raise CelEvalError("expression nesting too deep") from None

    def matches(self, variables: Mapping[str, Any], *, timeout: float | None = None) -> bool:
        """Evaluate a selector: True or False, or CelEvalError for an error or a non-bool result."""
        result = self.evaluate(variables, timeout=timeout)
        if not isinstance(result, celtypes.BoolType):
            raise CelEvalError(f"CEL result of type {_type_name(result)} could not be converted to bool")
        return bool(result)


_ENVIRONMENT: celpy.Environment | None = None


def _environment() -> celpy.Environment:
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = celpy.Environment(runner_class=_Runner)
    return _ENVIRONMENT


def compile_expression(
    expression: str, env: Env = Env.DRA, *, cost_limit: int = DEFAULT_COST_LIMIT
) -> CompiledExpression:
    """Parse and check ``expression`` for ``env``; raise CelCompileError naming the position."""
    size = len(expression.encode("utf-8"))
    if size > MAX_EXPRESSION_BYTES:
        raise CelCompileError(
            expression, f"expression is {size} bytes, longer than the limit of {MAX_EXPRESSION_BYTES}"
        )
    if not expression.strip():
        raise CelCompileError(expression, "expression is empty")
    environment = _environment()
    try:
        ast = environment.compile(expression)
    except celpy.CELParseError as ex:
        raise CelCompileError(expression, _syntax_reason(ex), ex.line, ex.column) from None
    except RecursionError:
        raise CelCompileError(expression, "expression nesting too deep") from None
    spec = _ENVS[env]
    try:
        result = _Checker(spec, expression).check(ast, {})
        _validate_regex_literals(ast)
    except _CheckError as ex:
        line, column = _position(ex.node)
        raise CelCompileError(expression, ex.reason, line, column) from None
    except RecursionError:
        raise CelCompileError(expression, "expression nesting too deep") from None
    if spec.require_bool and result.kind not in ("bool", "dyn"):
        raise CelCompileError(expression, f"must evaluate to bool, not {result}")
    runner = cast(_Runner, environment.program(_collapse(ast), functions=dict(spec.functions)))
    return CompiledExpression(expression, env, cost_limit, runner)


def _syntax_reason(error: celpy.CELParseError) -> str:
    cause = error.__context__
    if isinstance(cause, lark.exceptions.UnexpectedToken):
        token = cause.token
        shown = "end of input" if token.type == "$END" else repr(str(token))
        return f"syntax error: unexpected {shown}"
    if isinstance(cause, lark.exceptions.UnexpectedCharacters):
        return f"syntax error: unexpected character {cause.char!r}"
    return "syntax error"


@lru_cache(maxsize=512)
def cached_expression(expression: str, env: Env = Env.DRA) -> CompiledExpression:
    """compile_expression with a process-wide cache; selectors repeat across classes and claims."""
    return compile_expression(expression, env)


# --------------------------------------------------------------------------------------------
# Variables: the JSON (resource.k8s.io/v1) device turned into CEL values.


def _to_cel(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list):
        return celtypes.ListType([_to_cel(v) for v in value])
    if isinstance(value, dict):
        return celtypes.MapType({celtypes.StringType(k): _to_cel(v) for k, v in value.items()})
    if value is None:
        return None
    raise CelEvalError(f"unsupported value {value!r}")


def _attribute_value(name: str, attribute: Mapping[str, Any]) -> Any:
    """The one value a DeviceAttribute holds, as Kubernetes' getAttributeValue picks it."""
    try:
        if "ints" in attribute:
            return celtypes.ListType([celtypes.IntType(v) for v in attribute["ints"]])
        if "bools" in attribute:
            return celtypes.ListType([celtypes.BoolType(v) for v in attribute["bools"]])
        if "strings" in attribute:
            return celtypes.ListType([celtypes.StringType(v) for v in attribute["strings"]])
        if "versions" in attribute:
            versions: list[Any] = [parse_semver(v) for v in attribute["versions"]]
            return celtypes.ListType(versions)
        if "int" in attribute:
            return celtypes.IntType(attribute["int"])
        if "bool" in attribute:
            return celtypes.BoolType(attribute["bool"])
        if "string" in attribute:
            return celtypes.StringType(attribute["string"])
        if "version" in attribute:
            return parse_semver(attribute["version"])
    except (ValueError, TypeError) as ex:
        raise CelEvalError(f"attribute {name}: parse semantic version: {ex}") from None
    raise CelEvalError(f"attribute {name}: unsupported attribute value")


def _split_qualified(name: str, default_domain: str) -> tuple[str, str]:
    domain, slash, ident = name.partition("/")
    return (domain, ident) if slash else (default_domain, name)


def dra_device_variables(device: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """The ``device`` variable for a resource.k8s.io/v1 Device dict published by ``driver``.

    Unqualified attribute and capacity names belong to the driver's domain. Build once per device
    and reuse for every selector. Raises CelEvalError for an attribute Kubernetes could not convert
    (e.g. a malformed version), which Kubernetes reports as a runtime error of the selector.
    """
    attributes: dict[str, dict[Any, Any]] = {}
    for name, attribute in (device.get("attributes") or {}).items():
        domain, ident = _split_qualified(name, driver)
        attributes.setdefault(domain, {})[celtypes.StringType(ident)] = _attribute_value(name, attribute)
    capacity: dict[str, dict[Any, Any]] = {}
    for name, cap in (device.get("capacity") or {}).items():
        domain, ident = _split_qualified(name, driver)
        try:
            quantity = parse_quantity(str(cap.get("value", "")))
        except ValueError as ex:
            raise CelEvalError(f"capacity {name}: {ex}") from None
        capacity.setdefault(domain, {})[celtypes.StringType(ident)] = quantity
    value = celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                bool(device.get("allowMultipleAllocations", False))
            ),
            celtypes.StringType("attributes"): _DefaultingMap(
                {celtypes.StringType(d): celtypes.MapType(v) for d, v in attributes.items()}
            ),
            celtypes.StringType("capacity"): _DefaultingMap(
                {celtypes.StringType(d): celtypes.MapType(v) for d, v in capacity.items()}
            ),
        }
    )
    return {"device": value}


# DeviceAttribute JSON member -> Go field name, conversion, zero value.
_NATIVE_FIELDS: dict[str, tuple[str, Callable[[Any], Any], Any]] = {
    "int": ("IntValue", celtypes.IntType, 0),
    "bool": ("BoolValue", celtypes.BoolType, False),
    "string": ("StringValue", celtypes.StringType, ""),
    "version": ("VersionValue", celtypes.StringType, ""),
    "ints": ("IntValues", lambda v: celtypes.ListType([celtypes.IntType(x) for x in v]), []),
    "bools": ("BoolValues", lambda v: celtypes.ListType([celtypes.BoolType(x) for x in v]), []),
    "strings": ("StringValues", lambda v: celtypes.ListType([celtypes.StringType(x) for x in v]), []),
    "versions": ("VersionValues", lambda v: celtypes.ListType([celtypes.StringType(x) for x in v]), []),
}


def _zero_factory(convert: Callable[[Any], Any], zero: Any) -> Callable[[], Any]:
    return lambda: convert(zero)


_NativeStruct.ZEROS = {
    go_name: _zero_factory(convert, zero) for go_name, convert, zero in _NATIVE_FIELDS.values()
}


def filter_variables(device: Mapping[str, Any]) -> dict[str, Any]:
    """The ``attributes`` variable of dranet's --filter for a v1 Device dict (keys as published)."""
    attributes = {}
    for name, attribute in (device.get("attributes") or {}).items():
        values: dict[Any, Any] = {}
        for json_key, raw in attribute.items():
            field_spec = _NATIVE_FIELDS.get(json_key)
            if field_spec is not None and raw is not None:
                values[celtypes.StringType(field_spec[0])] = field_spec[1](raw)
        attributes[celtypes.StringType(name)] = _NativeStruct(values)
    return {"attributes": celtypes.MapType(attributes)}


# --------------------------------------------------------------------------------------------
# dranet's publish-time filter.


@dataclass(frozen=True)
class FilterOutcome:
    """What the filter decided for one device, and why when it was not a plain true/false."""

    device: str
    keep: bool
    error: str | None = None


def compile_filter(expression: str) -> CompiledExpression:
    """Compile a dranet ``--filter`` expression (variable ``attributes``)."""
    return compile_expression(expression, Env.FILTER)


def filter_devices(
    program: CompiledExpression | None, devices: Iterable[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], list[FilterOutcome]]:
    """Apply dranet's filter semantics: keep a device when the expression is true; an evaluation
    error keeps it too (dranet errs on the side of publishing), a non-bool result drops it.

    Returns the kept devices (in order) and the outcome per device for logging.
    """
    kept: list[Mapping[str, Any]] = []
    outcomes: list[FilterOutcome] = []
    for device in devices:
        name = str(device.get("name", ""))
        if program is None:
            kept.append(device)
            outcomes.append(FilterOutcome(name, True))
            continue
        try:
            result = program.evaluate(filter_variables(device))
        except CelEvalError as ex:
            kept.append(device)
            outcomes.append(FilterOutcome(name, True, f"evaluation failed: {ex}"))
            continue
        if not isinstance(result, celtypes.BoolType):
            outcomes.append(FilterOutcome(name, False, f"result is {_type_name(result)}, not bool"))
            continue
        if result:
            kept.append(device)
        outcomes.append(FilterOutcome(name, bool(result)))
    return kept, outcomes


__all__ = [
    "CIDR",
    "DEFAULT_COST_LIMIT",
    "IP",
    "MAX_EXPRESSION_BYTES",
    "CelCompileError",
    "CelEvalError",
    "CompiledExpression",
    "Env",
    "FilterOutcome",
    "Quantity",
    "Semver",
    "cached_expression",
    "compile_expression",
    "compile_filter",
    "dra_device_variables",
    "filter_devices",
    "filter_variables",
    "parse_quantity",
    "parse_semver",
]
