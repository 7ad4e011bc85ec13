"""JSON objects that remember the bytes they were sent as, as kube-apiserver's do for opaque parameters.

An opaque config's ``parameters`` is a ``runtime.RawExtension``: the server keeps its bytes as sent and
stores them compacted (``encoding/json`` compacts a ``MarshalJSON`` result). A later write of an allocated
claim's status is compared byte for byte (``apiequality.Semantic.DeepEqual`` on ``[]byte``), so the same
parameters re-encoded with other spacing or key order are "modified" and refused with 422. Clients that
re-encode JSON with spaces (Python's default ``', '`` / ``': '``) hit exactly that on a real server; the
simulated one models it through :func:`loads` and :func:`go_compact`.
"""

from __future__ import annotations

import json
import json.scanner
from typing import Any


class RawDict(dict):
    """A decoded JSON object and the exact text it was decoded from (``raw``)."""

    raw: str = ""


def _decoder() -> json.JSONDecoder:
    dec = json.JSONDecoder()
    parse_object = dec.parse_object  # type: ignore[attr-defined]  # set by JSONDecoder.__init__

    def keep_text(s_and_end: tuple[str, int], *args: Any) -> tuple[RawDict, int]:
        text, start = s_and_end
        obj, end = parse_object(s_and_end, *args)
        out = RawDict(obj)
        out.raw = text[start - 1:end]  # from the '{' the scanner stepped over
        return out, end

    dec.parse_object = keep_text  # type: ignore[attr-defined]
    dec.scan_once = json.scanner.py_make_scanner(dec)  # type: ignore[attr-defined]  # the C one cannot call back
    return dec


_DECODER = _decoder()


def loads(data: bytes | str) -> Any:
    """``json.loads`` whose objects are :class:`RawDict`, each knowing its text (slower: pure Python)."""
    text = data.decode() if isinstance(data, bytes) else data
    return _DECODER.decode(text)


_GO_HTML = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def go_compact(value: Any) -> str:
    """The bytes Go's ``encoding/json`` stores for a decoded value: compact, keys in their order, UTF-8,
    HTML characters escaped (``escapeHTML`` is on for ``json.Marshal``)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return "".join(_GO_HTML.get(c, c) for c in text) if any(c in text for c in _GO_HTML) else text


def sent_as(value: Any) -> str:
    """The bytes a client sent for ``value`` (its text when it was decoded by :func:`loads`)."""
    raw = getattr(value, "raw", None)
    return raw if isinstance(raw, str) and raw else go_compact(value)


#: the kinds whose objects carry opaque configs (``runtime.RawExtension`` parameters)
WITH_OPAQUE = frozenset({"ResourceClaim", "ResourceClaimTemplate", "DeviceClass"})


def reencoded(kind: str, obj: Any) -> Any:
    """``obj`` as the server has it after a patch or an apply: kube-apiserver merges on the stored
    object encoded again as JSON, so the parameters are compacted, no longer the bytes first sent (a
    claim whose parameters were stored spaced then takes no JSON status write at all: seen on 1.37.2
    with a merge, strategic, JSON or apply patch, and a PUT)."""
    return json.loads(json.dumps(obj)) if kind in WITH_OPAQUE else obj

