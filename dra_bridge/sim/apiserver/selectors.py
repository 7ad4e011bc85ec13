"""Label and field selectors with the Kubernetes grammar.

Label selectors (``k8s.io/apimachinery/pkg/labels``): comma-separated requirements
``key``, ``!key``, ``key=value``, ``key==value``, ``key!=value``,
``key in (a,b)``, ``key notin (a,b)``, ``key>n``, ``key<n``; all must hold.

Field selectors (``k8s.io/apimachinery/pkg/fields``): ``field=value``,
``field==value``, ``field!=value``, comma-separated, with ``\\,`` ``\\=`` ``\\\\``
escapes; only fields the resource supports are accepted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dra_bridge.sim.apiserver.errors import bad_request

_KEY = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"

_EXISTS = re.compile(rf"^({_KEY})$")
_NOT_EXISTS = re.compile(rf"^!\s*({_KEY})$")
_EQUALITY = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\((.*)\)$")
_NUMERIC = re.compile(rf"^({_KEY})\s*(>|<)\s*(-?\d+)$")
_SET_VALUE = re.compile(rf"^{_VALUE}$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # exists, !, =, !=, in, notin, >, <
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op in (">", "<"):
            if not present:
                return False
            try:
                n = int(value)  # type: ignore[arg-type]
            except ValueError:
                return False
            return n > int(self.values[0]) if self.op == ">" else n < int(self.values[0])
        raise AssertionError(self.op)


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    terms: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    terms.append("".join(cur))
    return [t.strip() for t in terms]


def parse_label_selector(selector: str | None) -> list[Requirement]:
    if selector is None or not selector.strip():
        return []
    reqs: list[Requirement] = []
    for term in _split_terms(selector):
        if not term:
            raise bad_request(f"unable to parse requirement: empty requirement in {selector!r}")
        if m := _NOT_EXISTS.match(term):
            reqs.append(Requirement(m.group(1), "!"))
        elif m := _SET.match(term):
            values = tuple(v.strip() for v in m.group(3).split(","))
            if any(not _SET_VALUE.match(v) for v in values):
                raise bad_request(f"unable to parse requirement: invalid values in {term!r}")
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _NUMERIC.match(term):
            reqs.append(Requirement(m.group(1), m.group(2), (m.group(3),)))
        elif m := _EQUALITY.match(term):
            op = "!=" if m.group(2) == "!=" else "="
            reqs.append(Requirement(m.group(1), op, (m.group(3),)))
        elif m := _EXISTS.match(term):
            reqs.append(Requirement(m.group(1), "exists"))
        else:
            raise bad_request(f"unable to parse requirement: {term!r}")
    return reqs


def label_matcher(selector: str | None) -> Callable[[dict], bool]:
    reqs = parse_label_selector(selector)

    def match(obj: dict) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in reqs)

    return match


def _split_unescaped(s: str, sep: str) -> list[str]:
    out, cur, i = [], [], 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s):
            cur.append(s[i : i + 2])
            i += 2
            continue
        if ch == sep:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    out.append("".join(cur))
    return out


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s)


def parse_field_selector(selector: str | None, allowed: Iterable[str]) -> list[tuple[str, str, str]]:
    """``[(field, op, value)]`` with op ``=`` or ``!=``; unknown fields are a 400 like k8s."""
    if selector is None or not selector.strip():
        return []
    allowed = set(allowed)
    out = []
    for term in _split_unescaped(selector, ","):
        term = term.strip()
        if not term:
            continue
        m = re.match(r"^([^=!]+?)\s*(==|!=|=)(.*)$", term)
        if not m:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        key, op, value = m.group(1).strip(), m.group(2), _unescape(m.group(3).strip())
        if key not in allowed:
            raise bad_request(f'field label not supported: {key}')
        out.append((key, "!=" if op == "!=" else "=", value))
    return out


def field_matcher(selector: str | None, allowed: Iterable[str],
                  value_of: Callable[[dict, str], str]) -> Callable[[dict], bool]:
    terms = parse_field_selector(selector, allowed)

    def match(obj: dict) -> bool:
        for key, op, value in terms:
            actual = value_of(obj, key)
            if (actual == value) != (op == "="):
                return False
        return True

    return match
