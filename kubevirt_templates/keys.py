"""The ``--set`` keys of each template, read off its typed input, so the help cannot drift from
what the template accepts: every field is a key, with its description and its default. A value
the input refuses is told in the same words as a layout's problems: the key, what is allowed,
and a "did you mean" for a misspelt key or choice, never pydantic's own wording."""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

_LONG = 60  # a default longer than this is cut short
_KEY_WIDTH = 26  # the key column; a longer key pushes its meaning along


def _bare(tp: Any) -> Any:
    """``T`` from ``T | None`` and ``Annotated[T, ...]``."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _bare(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return _bare(args[0]) if len(args) == 1 else tp
    return tp


def _extra(f: FieldInfo, key: str) -> Any:
    return f.json_schema_extra.get(key) if isinstance(f.json_schema_extra, dict) else None


def key_of(name: str, f: FieldInfo) -> str:
    """How the key is written on the command line: ``gpus.<TYPE>=N``, ``display=true|false``, ``name``."""
    tp = _bare(f.annotation)
    origin = get_origin(tp)
    if origin is dict:
        value = "N" if get_args(tp)[1:] and _bare(get_args(tp)[1]) is int else "VALUE"
        return f"{name}.<{_extra(f, 'key') or 'KEY'}>={value}"
    if origin is Literal:
        return f"{name}={'|'.join(str(a) for a in get_args(tp))}"
    if tp is bool:
        return f"{name}=true|false"
    if tp is int:
        return f"{name}=N"
    if origin is list:
        return f"{name}=[A,B]"
    return name


def default_of(f: FieldInfo) -> str:
    """The default as the help shows it (``required`` when there is none)."""
    if f.is_required():
        return "required"
    shown = _extra(f, "shown_default")
    if shown:
        return shown
    value = f.default_factory() if f.default_factory is not None else f.default  # type: ignore[call-arg]
    if value is None:
        return "unset"
    if value in ([], {}):
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    return text if len(text) <= _LONG else text[:_LONG - 3] + "..."


def set_keys(model: type[BaseModel]) -> list[tuple[str, str, str]]:
    """(key, meaning, default) of every field of ``model``: its own fields first, in declaration
    order, then those it inherits (the DRA driver and class names every DRA template shares)."""
    own = model.__dict__.get("__annotations__", {})
    names = [n for n in model.model_fields if n in own] + [n for n in model.model_fields if n not in own]
    return [(key_of(n, model.model_fields[n]), model.model_fields[n].description or "",
             default_of(model.model_fields[n])) for n in names]


def keys_help(model: type[BaseModel], indent: str = "  ") -> str:
    """The keys as help lines: ``  gpus.<TYPE>=N   how many vGPUs ... (default: none)``."""
    lines = []
    for key, meaning, default in set_keys(model):
        shown = "(required)" if default == "required" else f"(default: {default})"
        if default == "unset" and "unset:" in meaning:
            shown = ""  # the meaning says what unset means
        lines.append(f"{indent}{key:<{_KEY_WIDTH - 2}}  {meaning} {shown}".rstrip())
    return "\n".join(lines)


def _did_you_mean(word: object, choices: list[str]) -> str:
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1)
    return f"; did you mean {by_lower[close[0]]!r}?" if close and by_lower[close[0]] != str(word) else ""


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def _kind(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)


def explain(errors: Sequence[ErrorDetails], model: type[BaseModel], kind: str) -> list[str]:
    """pydantic's errors for ``kind``'s input as ``key: what is wrong; what is allowed``."""
    keys = list(model.model_fields)
    out = []
    for e in errors:
        loc, value, ctx, t = tuple(e["loc"]), e.get("input"), e.get("ctx") or {}, e["type"]
        key = _path(loc)
        if t == "extra_forbidden":
            msg = f"unknown key{_did_you_mean(loc[-1], keys)} (the keys: vgpuctl render {kind} -h)"
        elif t == "missing":
            msg = "required"
        elif t == "literal_error":
            allowed = [a.strip("'") for a in ctx.get("expected", "").replace(" or ", ", ").split(", ")]
            msg = f"{value!r} is not allowed (allowed: {', '.join(allowed)}){_did_you_mean(value, allowed)}"
        elif t in ("int_type", "int_parsing", "int_from_float"):
            msg = f"{value!r} is not a whole number"
        elif t in ("bool_type", "bool_parsing"):
            msg = f"{value!r} is not true or false"
        elif t in ("greater_than_equal", "less_than_equal"):
            msg = f"{value!r} must be {'>=' if 'ge' in ctx else '<='} {ctx.get('ge', ctx.get('le'))}"
        elif t == "list_type":
            msg = f"expected a list such as [A, B], not {_kind(value)}"
        elif t == "dict_type":
            msg = f"expected a mapping such as {loc[-1]}.KEY=VALUE, not {_kind(value)}"
        elif t == "string_type":
            msg = f"{value!r} is {_kind(value)}, not text"
        else:  # our validators' words (they name their key), or pydantic's, rephrased
            msg = e["msg"].removeprefix("Value error, ").replace("Input should be", "expected")
            if not key or msg.startswith(str(loc[-1])):
                out.append(msg)
                continue
        out.append(f"{key}: {msg}" if key else msg)
    return out


__all__ = ["default_of", "explain", "key_of", "keys_help", "set_keys"]
