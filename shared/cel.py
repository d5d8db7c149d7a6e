"""CEL for dranet's publish-time ``--filter``: compile once, evaluate per device. Pure, no I/O.

The environment is dranet's (pkg/filter): one variable ``attributes``, a map from the qualified
attribute name (``dra.net/type``) to a DeviceAttribute object with the Go field names ``IntValue``,
``BoolValue``, ``StringValue``, ``VersionValue`` (and the list forms ``IntValues``...); an unset field
reads as its zero value, as with cel-go native types. Standard CEL functions only (dranet builds a bare
``cel.NewEnv`` with no extensions). DRA selectors are not evaluated here: kube-scheduler does that.

Parsing and evaluation use cel-python (``celpy``) with its interpreted runner for the whole process:
its ``CompiledRunner`` cannot call custom functions (the transpiled code names the function's module),
it breaks once any interpreted ``Environment`` exists in the process (the Lark parser is a class-level
singleton built with the first tree class), and it keeps the activation in module globals, so it is not
safe from worker threads. celpy has no type checker; :func:`compile_filter` runs our own checker over
the parse tree so that undeclared names, unknown fields and functions, mismatched literal types and
invalid regular expression literals fail at compile time, with the position, as they do in cel-go.

One module (over 800 lines) because its three parts share one set of private tables: the
checker checks calls against the same function overloads and value types that the evaluator
runs, and a split would either export those tables or keep two copies that can drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, cast

import celpy
import lark
import re2  # type: ignore[import-untyped]
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator, celstr

# Limits on an expression, the ones Kubernetes sets for DRA selectors: its size in bytes
# (resource.k8s.io/v1 CELSelectorExpressionMaxLength) and the evaluation steps per device
# (CELSelectorExpressionMaxCost).
MAX_EXPRESSION_BYTES = 10 * 1024
DEFAULT_COST_LIMIT = 1_000_000
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1


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
    """Evaluating a compiled expression for one input failed (a runtime error in cel-go terms)."""


def _excerpt(expression: str, limit: int = 200) -> str:
    text = expression if len(expression) <= limit else expression[:limit] + "..."
    return repr(text)


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
        # The checker refuses int < double between typed operands; through dyn they compare by value.
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


def _fn_size(v: _Value) -> _Value:
    if isinstance(v, (str, bytes, list, dict)):
        return celtypes.IntType(len(v))
    raise TypeError(f"no such overload: size({_type_name(v)})")


# Functions replacing celpy's for cel-go semantics (its base set covers the rest of the standard library).
_FUNCTIONS: dict[str, Callable[..., Any]] = {
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


def _list(t: _T) -> _T:
    return _T("list", (t,))


def _map(k: _T, v: _T) -> _T:
    return _T("map", (k, v))


LIST_DYN, MAP_DYN = _list(DYN), _map(DYN, DYN)
_NUMERIC = frozenset({"int", "uint", "double"})
_NATIVE_ATTRIBUTE = _T("object", name="v1.DeviceAttribute")
_OBJECT_FIELDS: dict[str, dict[str, _T]] = {
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


@dataclass(frozen=True)
class _Overload:
    receiver: _T | None
    params: tuple[_T, ...]
    result: _T


def _g(params: Sequence[_T], result: _T) -> _Overload:
    return _Overload(None, tuple(params), result)


def _m(receiver: _T, params: Sequence[_T], result: _T) -> _Overload:
    return _Overload(receiver, tuple(params), result)


_DECLS: dict[str, list[_Overload]] = {
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

# The one variable: attributes["dra.net/type"] is a DeviceAttribute.
_VARIABLES: dict[str, _T] = {"attributes": _map(STRING, _NATIVE_ATTRIBUTE)}


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


def _homogeneous(types: list[_T]) -> _T:
    """The element type of a list or map literal: dyn unless all are one type (mixed ones are allowed)."""
    known = [t for t in types if t.kind != "dyn"]
    if not known:
        return DYN
    first = known[0]
    if not all(_accepts(first, t) for t in known[1:]):
        return DYN
    return first if len(known) == len(types) else DYN


def _simple_ident(tree: lark.Tree) -> str | None:
    node = _single_child(tree)
    if node is not None and node.data == "ident":
        return str(node.children[0])
    return None


class _Checker:
    def __init__(self, source: str):
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
                # No cross-type numeric comparisons: dranet's environment does not enable them.
                if left.kind != right.kind:
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
        operand = self.check(operand_node, scope)
        if name in _MACROS:
            return self._macro(name, operand, args_tree, scope, tree)
        overloads = _DECLS.get(name)
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
        overloads = _DECLS.get(name)
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
        if name in _VARIABLES:
            return _VARIABLES[name]
        if name in _TYPE_NAMES:
            return TYPE
        raise _CheckError(f"undeclared reference to '{name}'", tree.children[0])

    def _dot_ident(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        return self._ident(tree, {})

    def _list_lit(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        elements = self._args(tree.children[0] if tree.children else None, scope)
        return _list(_homogeneous(elements))

    def _map_lit(self, tree: lark.Tree, scope: Mapping[str, _T]) -> _T:
        items = self._args(tree.children[0] if tree.children else None, scope)
        keys, values = items[0::2], items[1::2]
        for k in keys:
            if k.kind not in ("int", "uint", "bool", "string", "dyn"):
                raise _CheckError(f"unsupported map key type '{k}'", tree)
        return _map(_homogeneous(keys), _homogeneous(values))

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


def _validate_regex_literals(tree: lark.Tree) -> None:
    """Reject a literal matches() pattern RE2 cannot compile at compile time, not per device."""
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and len(node.children) == 3 and str(node.children[1]) == "matches":
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
    steps: int = 0


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
    """celpy's interpreter plus cel-go's quantifiers, faithful has(), and a step budget."""

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
        return super()._visit_tree(tree)

    def member_dot_arg(self, tree: lark.Tree) -> Any:
        name = str(tree.children[1])
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
    cost_limit: int
    _runner: _Runner = field(repr=False, compare=False)

    def evaluate(self, variables: Mapping[str, Any]) -> Any:
        """Evaluate against prepared variables (see :func:`filter_variables`); raise CelEvalError.

        The result is any CEL value: the filter decides what a non-bool means.
        """
        budget = _Budget(self.cost_limit)
        try:
            return self._runner.run(variables, budget)
        except CELEvalError as ex:
            raise CelEvalError(_describe(ex)) from None
        except _CostExceeded as ex:
            raise CelEvalError(str(ex)) from None
        except RecursionError:
            raise CelEvalError("expression nesting too deep") from None


_ENVIRONMENT: celpy.Environment | None = None


def _environment() -> celpy.Environment:
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = celpy.Environment(runner_class=_Runner)
    return _ENVIRONMENT


def compile_filter(expression: str, *, cost_limit: int = DEFAULT_COST_LIMIT) -> CompiledExpression:
    """Parse and check a dranet ``--filter`` expression (variable ``attributes``); raise
    CelCompileError naming the position. Any result type is accepted: the caller decides what a
    non-bool result means (services.inventory.filter drops the device)."""
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
    try:
        _Checker(expression).check(ast, {})
        _validate_regex_literals(ast)
    except _CheckError as ex:
        line, column = _position(ex.node)
        raise CelCompileError(expression, ex.reason, line, column) from None
    except RecursionError:
        raise CelCompileError(expression, "expression nesting too deep") from None
    runner = cast(_Runner, environment.program(_collapse(ast), functions=dict(_FUNCTIONS)))
    return CompiledExpression(expression, cost_limit, runner)


def _syntax_reason(error: celpy.CELParseError) -> str:
    cause = error.__context__
    if isinstance(cause, lark.exceptions.UnexpectedToken):
        token = cause.token
        shown = "end of input" if token.type == "$END" else repr(str(token))
        return f"syntax error: unexpected {shown}"
    if isinstance(cause, lark.exceptions.UnexpectedCharacters):
        return f"syntax error: unexpected character {cause.char!r}"
    return "syntax error"


# --------------------------------------------------------------------------------------------
# Variables: a resource.k8s.io/v1 Device dict as dranet's filter sees it.


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


__all__ = [
    "DEFAULT_COST_LIMIT",
    "MAX_EXPRESSION_BYTES",
    "CelCompileError",
    "CelEvalError",
    "CompiledExpression",
    "compile_filter",
    "filter_variables",
]
