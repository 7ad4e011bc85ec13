"""vGPU types named in render values, checked against the types that exist.

A claim selects devices by the ``profile`` attribute, which is exact: ``gpus.t4-8q`` or a
misspelt ``T4-99Q`` would render a VM that never starts. So every type a template names is
matched, case-insensitively, against a list of known types (the catalog's, or a node's when
its inventory is at hand) and written as that list spells it; an unknown one is refused,
naming the key, where the list comes from, and the closest names. Pure: the caller says
which types exist (:class:`KnownTypes`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_bridge.api.names import profile_of as short_type_name


@dataclass(frozen=True)
class KnownTypes:
    """The vGPU types a render may name, and how to say where they come from.

    ``types`` are (id, full name) pairs; ``source`` ends "is not a vGPU type of ..." (``vgpuctl's
    catalog``, ``the simulated node``); ``listing`` says how to see them all; ``mig_backed`` are
    types that exist but are never published (they need MIG mode).
    """

    types: tuple[tuple[str, str], ...]
    source: str
    listing: str
    mig_backed: frozenset[str] = frozenset()
    _by_ref: dict[str, tuple[str, str]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for tid, name in self.types:
            short = short_type_name(name)
            for ref in (short, name, tid):  # a short name wins over an id spelled the same
                self._by_ref.setdefault(ref.lower(), (name, short))

    def canonical(self, ref: str) -> str | None:
        """``ref`` as the list spells it: a short name for a short name or an id, the full name for
        a full name; None when unknown."""
        hit = self._by_ref.get(str(ref).strip().lower())
        if hit is None:
            return None
        name, short = hit
        return name if " " in str(ref).strip() else short

    def problem(self, key: str, ref: str) -> str:
        """Why ``ref`` (at ``key``) is refused: one line with the closest names and where to look."""
        if short_type_name(str(ref)).lower() in self.mig_backed:
            return (f"{key}: {ref} is MIG-backed, and no GPU of {self.source} has MIG (NVML reports none); "
                    "choose a time-sliced type")
        shorts = sorted({short_type_name(n) for _, n in self.types})
        pool = sorted({n for _, n in self.types}) if " " in str(ref).strip() else shorts
        by_lower = {p.lower(): p for p in pool}
        close = [by_lower[c] for c in difflib.get_close_matches(str(ref).lower(), list(by_lower), n=3)]
        hint = f"; did you mean {_either(close)}?" if close else ""
        return f"{key}: {ref!r} is not a vGPU type of {self.source}{hint} ({self.listing})"


def _either(names: list[str]) -> str:
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def check_types(kind: str, values: Mapping[str, Any], known: KnownTypes) -> tuple[dict[str, Any], list[str]]:
    """``values`` with every vGPU type it names written as ``known`` spells it, and the problems
    with those it does not know. Keys: ``gpus.<TYPE>`` (vm), ``profile`` and
    ``first_available[i]`` (claim-template).
    Anything not shaped as expected is left for the input model to refuse."""
    out, problems = dict(values), []
    if kind == "vm" and isinstance(values.get("gpus"), dict):
        gpus: dict[Any, Any] = {}
        given: dict[str, str] = {}
        for ref, n in values["gpus"].items():
            name = known.canonical(ref) if isinstance(ref, str) else None
            if name is None:
                problems.append(known.problem(f"gpus.{ref}", ref))
            elif name in given:
                problems.append(f"gpus.{ref}: names the same type as gpus.{given[name]} ({name}); list each type once")
            given.setdefault(name or ref, ref)
            gpus[name or ref] = n
        out["gpus"] = gpus
    if kind == "claim-template":
        if isinstance(values.get("profile"), str):
            name = known.canonical(values["profile"])
            if name is None:
                problems.append(known.problem("profile", values["profile"]))
            out["profile"] = name or values["profile"]
        if isinstance(values.get("first_available"), list):
            refs = []
            for i, ref in enumerate(values["first_available"]):
                name = known.canonical(ref) if isinstance(ref, str) else None
                if name is None and isinstance(ref, str):
                    problems.append(known.problem(f"first_available[{i}]", ref))
                refs.append(name or ref)
            out["first_available"] = refs
    return out, problems


#: The kinds whose values name vGPU types.
TYPED_KINDS = ("vm", "claim-template")

__all__ = ["KnownTypes", "TYPED_KINDS", "check_types"]
