"""Label selectors (set-based grammar of ``labels.Parse``) and field selectors (``fields.ParseSelector``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import names
from .errors import ApiError, bad_request


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # exists, !, =, !=, in, notin, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key, "")
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op == "=":
            return has and value == self.values[0]
        if self.op == "!=":
            return not has or value != self.values[0]
        if self.op == "in":
            return has and value in self.values
        if self.op == "notin":
            return not has or value not in self.values
        if not has:
            return False
        try:
            have, want = int(value), int(self.values[0])
        except ValueError:
            return False
        return have > want if self.op == "gt" else have < want


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


_SPECIAL = "=!(),<>"
_token_re = re.compile(r"\s*(!=|==|=|!|\(|\)|,|<|>|[^\s=!(),<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _token_re.match(text, pos)
        if not m:
            raise bad_request(f"unable to parse requirement: unexpected character at {text[pos:]!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


def _check_key(key: str) -> None:
    errs = names.qualified_name(key)
    if errs:
        raise bad_request(f'unable to parse requirement: key: Invalid value: "{key}": {"; ".join(errs)}')


def _check_value(value: str) -> None:
    errs = names.label_value(value)
    if errs:
        raise bad_request(
            f'unable to parse requirement: values[0]: Invalid value: "{value}": {"; ".join(errs)}'
        )


def parse_labels(text: str | None) -> LabelSelector:
    """Parse ``a=b,c!=d,e in (x,y),!f,g,h>3``; 400 BadRequest on a malformed selector."""
    if not text or not text.strip():
        return LabelSelector()
    toks = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def expect_ident(what: str) -> str:
        nonlocal i
        if i >= len(toks) or toks[i] in _SPECIAL or toks[i] in ("!=", "=="):
            found = toks[i] if i < len(toks) else "end of string"
            raise bad_request(f"unable to parse requirement: found '{found}', expected: {what}")
        i += 1
        return toks[i - 1]

    while i < len(toks):
        if toks[i] == "!":
            i += 1
            key = expect_ident("identifier after '!'")
            _check_key(key)
            reqs.append(Requirement(key, "!"))
        else:
            key = expect_ident("identifier")
            _check_key(key)
            op = toks[i] if i < len(toks) else ","
            if op == ",":
                reqs.append(Requirement(key, "exists"))
            elif op in ("=", "==", "!="):
                i += 1
                value = ""
                if i < len(toks) and toks[i] != ",":
                    value = expect_ident("value")
                _check_value(value)
                reqs.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
            elif op in (">", "<"):
                i += 1
                value = expect_ident("integer value")
                try:
                    int(value)
                except ValueError:
                    raise bad_request(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: "
                        f"{value!r}"
                    ) from None
                reqs.append(Requirement(key, "gt" if op == ">" else "lt", (value,)))
            elif op in ("in", "notin"):
                i += 1
                if i >= len(toks) or toks[i] != "(":
                    raise bad_request("unable to parse requirement: found '', expected: '('")
                i += 1
                values: list[str] = []
                want_value = True
                while True:
                    if i >= len(toks):
                        raise bad_request("unable to parse requirement: found 'end of string', expected: ')'")
                    t = toks[i]
                    i += 1
                    if t == ")":
                        if want_value and values:
                            values.append("")
                        break
                    if t == ",":
                        if want_value:
                            values.append("")
                        want_value = True
                    elif want_value and t not in _SPECIAL:
                        values.append(t)
                        want_value = False
                    else:
                        raise bad_request(f"unable to parse requirement: found '{t}', expected: ',', ')'")
                for v in values:
                    _check_value(v)
                if not values:
                    raise bad_request(
                        "unable to parse requirement: for 'in', 'notin' operators, values set can't be empty"
                    )
                reqs.append(Requirement(key, op, tuple(values)))
            else:
                raise bad_request(
                    f"unable to parse requirement: found '{op}', expected: in, notin, =, ==, !=, gt, lt"
                )
        if i < len(toks):
            if toks[i] != ",":
                raise bad_request(f"unable to parse requirement: found '{toks[i]}', expected: ','")
            i += 1
            if i >= len(toks):
                raise bad_request("unable to parse requirement: found 'end of string', expected: identifier")
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True)
class FieldTerm:
    field: str
    value: str
    negate: bool


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[FieldTerm, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        for t in self.terms:
            have = fields.get(t.field, "")
            if (have == t.value) == t.negate:
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.terms

    def value_of(self, field_name: str) -> str | None:
        """The value an ``=`` term requires, for indexed lookups (e.g. metadata.name)."""
        for t in self.terms:
            if t.field == field_name and not t.negate:
                return t.value
        return None


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, esc = [], [], False
    for ch in text:
        if esc:
            cur.append("\\" + ch)
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if esc:
        cur.append("\\")
    parts.append("".join(cur))
    return parts


def _unescape(text: str) -> str:
    out, esc = [], False
    for ch in text:
        if esc:
            if ch not in "\\,=!":
                raise bad_request(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            esc = False
        elif ch == "\\":
            esc = True
        else:
            out.append(ch)
    return "".join(out)


def _find_op(term: str) -> tuple[int, str] | None:
    esc = False
    for i, ch in enumerate(term):
        if esc:
            esc = False
            continue
        if ch == "\\":
            esc = True
            continue
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return i, op
    return None


def parse_fields(text: str | None) -> FieldSelector:
    """Parse ``a=b,c!=d``; 400 BadRequest on a malformed selector."""
    if not text or not text.strip():
        return FieldSelector()
    terms: list[FieldTerm] = []
    for raw in _split_unescaped(text, ","):
        if not raw:
            continue
        found = _find_op(raw)
        if found is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{raw}'")
        pos, op = found
        terms.append(FieldTerm(_unescape(raw[:pos]), _unescape(raw[pos + len(op) :]), op == "!="))
    return FieldSelector(tuple(terms))


def check_supported(
    selector: FieldSelector, supported: tuple[str, ...], unsupported: Callable[[str], str]
) -> None:
    """400 BadRequest naming the first field label the resource does not index, as the real server does."""
    for t in selector.terms:
        if t.field not in supported:
            raise ApiError(400, "BadRequest", unsupported(t.field))
