"""vGPU types named in render values, checked against the types that exist.

A claim selects devices by their published attributes, which are exact: ``gpus.t4-8q`` or a
misspelt ``T4-99Q`` would render a VM that never starts. So every type a template names is
matched, case-insensitively, against a list of known types (the catalog's, or a node's when
its inventory is at hand) and written as that list spells it; an unknown one is refused,
naming the key, where the list comes from, and the closest names. Every value a node publishes
as a device's ``profile`` is taken where a profile is asked for, as a user copies it from
``kubectl get resourceslices``: a vGPU type, the GPU-instance profile of a MIG-backed vGPU
(``1g.5gb``), or the GPU model a whole GPU publishes (a passthrough claim of that product).
Pure: the caller says which types and products exist (:class:`KnownTypes`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_bridge.api.names import profile_of as short_type_name
from kubevirt_templates.names import shared_type_problem
from mdev_manager.names import mig_profile_of


@dataclass(frozen=True)
class KnownTypes:
    """The vGPU types a render may name, and how to say where they come from.

    ``types`` are (id, full name) pairs; ``source`` ends "is not a vGPU type of ..." (``vgpuctl's
    catalog``, ``the simulated node``); ``listing`` says how to see them all; ``mig_backed`` are
    types that exist but are never published (they need MIG mode); ``products`` the GPU models
    (pci.ids names) whole GPUs publish as their ``profile`` and ``productName``. The GPU-instance
    profiles are those of the MIG-backed ``types``. ``boards``: (full name, the board of the GPUs
    offering it), where the types are GPUs' (an inventory): a short name is then written as the full
    name of those GPUs' type where a device-plugin resource is named after it (``DC-2-16Q``, a type
    of the RTX PRO 6000 and the 4500 alike, each a resource of its own full name). ``instances``:
    (full name, its GPU-instance profile) where the board says so (``DC-2-16Q`` lives on 2g.48gb on
    the 6000, on 2g.32gb on the 4500); else the name's grammar tells it (``A100-3-20C``: 3g.20gb).
    """

    types: tuple[tuple[str, str], ...]
    source: str
    listing: str
    mig_backed: frozenset[str] = frozenset()
    products: tuple[str, ...] = ()
    boards: tuple[tuple[str, str], ...] = ()
    instances: tuple[tuple[str, str], ...] = ()
    _by_ref: dict[str, tuple[str, str]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _instances: dict[str, tuple[str, set[str]]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _full: dict[str, dict[str, str]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        board, on = dict(self.boards), dict(self.instances)
        for tid, name in self.types:
            short = short_type_name(name)
            for ref in (short, name, tid):  # a short name wins over an id spelled the same
                self._by_ref.setdefault(ref.lower(), (name, short))
            if (gi := on.get(name) or mig_profile_of(name)) is not None:
                self._instances.setdefault(gi.lower(), (gi, set()))[1].add(short)
            if name in board:
                self._full.setdefault(short.lower(), {}).setdefault(name, board[name])

    def full_name(self, key: str, name: str, problems: list[str]) -> str:
        """``name`` as the full name a device-plugin resource is named after, where the GPUs' boards
        are known and these GPUs have one type of that short name; a short name two of their boards
        share is a problem (one line: the boards, the full names); else unchanged."""
        fulls = self._full.get(name.lower()) if " " not in name else None
        if not fulls:
            return name
        if len(fulls) == 1:
            return next(iter(fulls))
        problems.append(shared_type_problem(key, name, [(b, f) for f, b in fulls.items()], f"on {self.source}",
                                            inventory=False))
        return name

    def instance_profile(self, ref: str) -> str | None:
        """``ref`` as NVIDIA spells a GPU-instance profile some MIG-backed type here takes; None if none."""
        hit = self._instances.get(str(ref).strip().lower())
        return hit[0] if hit else None

    def instance_types(self, profile: str) -> list[str]:
        """The MIG-backed types (short names) whose GPU instance is ``profile``."""
        return sorted(self._instances.get(profile.lower(), ("", set()))[1])

    def product(self, ref: str) -> str | None:
        """``ref`` as a GPU model here is spelled; None if no GPU here is that model."""
        want = str(ref).strip().lower()
        return next((p for p in self.products if p.lower() == want), None)

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
        if short_type_name(str(ref)).lower() in self.mig_backed or str(ref).strip().lower() in {
                (mig_profile_of(t) or "").lower() for t in self.mig_backed}:
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


def _classic(known: KnownTypes, key: str, profile: str, problems: list[str]) -> str:
    """A GPU-instance profile as the one MIG-backed type it stands for, where a device-plugin
    resource is named after a type (classic VMs, extended resources); other names unchanged."""
    if known.instance_profile(profile) is None:
        return profile
    types = known.instance_types(profile)
    if len(types) != 1:
        problems.append(f"{key}: GPU-instance profile {profile} carries {_either(types)} on {known.source}, each "
                        "its own device-plugin resource; name the vGPU type instead")
        return profile
    return types[0]


def check_types(kind: str, values: Mapping[str, Any], known: KnownTypes) -> tuple[dict[str, Any], list[str]]:
    """``values`` with every vGPU type it names written as ``known`` spells it, and the problems
    with those it does not know. Keys: ``gpus.<TYPE>`` (vm), ``profile`` and
    ``first_available[i]`` (claim-template), ``profiles`` (deviceclasses). Where a profile is
    asked for, a GPU-instance profile is taken as one (``1g.5gb``), and a whole GPU's model (its
    published ``profile``) as a passthrough claim or class of that product.
    Anything not shaped as expected is left for the input model to refuse."""
    out, problems = dict(values), []

    def vgpu(ref: Any) -> str | None:
        if not isinstance(ref, str):
            return None
        return known.canonical(ref) or known.instance_profile(ref)

    if kind == "vm" and isinstance(values.get("gpus"), dict):
        gpus: dict[Any, Any] = {}
        given: dict[str, str] = {}
        for ref, n in values["gpus"].items():
            name = vgpu(ref)
            if name is None:
                problems.append(known.problem(f"gpus.{ref}", ref))
            elif values.get("mode", "classic") == "classic":
                name = known.full_name(f"gpus.{ref}", _classic(known, f"gpus.{ref}", name, problems), problems)
            if name is not None and name in given:
                problems.append(f"gpus.{ref}: names the same type as gpus.{given[name]} ({name}); list each type once")
            given.setdefault(name or ref, ref)
            gpus[name or ref] = n
        out["gpus"] = gpus
    if kind == "claim-template":
        if isinstance(values.get("profile"), str):
            name = vgpu(values["profile"])
            product = known.product(values["profile"]) if name is None else None
            if product is not None:  # the profile a whole GPU publishes: that GPU, passed through
                del out["profile"]
                out.update(passthrough=True, product=product)
            else:
                if name is None:
                    problems.append(known.problem("profile", values["profile"]))
                out["profile"] = name or values["profile"]
        if isinstance(values.get("first_available"), list):
            refs = []
            for i, ref in enumerate(values["first_available"]):
                name = vgpu(ref)
                if name is None and isinstance(ref, str):
                    problems.append(known.problem(f"first_available[{i}]", ref))
                refs.append(name or ref)
            out["first_available"] = refs
    if kind == "deviceclasses" and isinstance(values.get("profiles"), list):
        profiles, products = [], list(values.get("products") or [])
        for ref in values["profiles"]:
            name = vgpu(ref)
            product = known.product(ref) if name is None and isinstance(ref, str) else None
            if product is not None:  # a whole GPU's profile: the class of that product
                products.append(product)
                continue
            if name is None and isinstance(ref, str):
                problems.append(known.problem(f"profiles.{ref}", ref))
            elif name is not None and values.get("extended_resources") in (True, "true"):
                name = known.full_name(f"profiles.{ref}", _classic(known, f"profiles.{ref}", name, problems), problems)
            profiles.append(name or ref)
        out["profiles"] = profiles
        if products:
            out["products"] = products
    return out, problems


#: The kinds whose values name vGPU types.
TYPED_KINDS = ("vm", "claim-template", "deviceclasses")

__all__ = ["KnownTypes", "TYPED_KINDS", "check_types"]
