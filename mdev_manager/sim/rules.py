"""Stateless rules of the simulated kernel: number parsing, errors, VF addresses, type facts, capacity.

Kept apart from :mod:`mdev_manager.sim.tree` (the state) and :mod:`mdev_manager.sim.kernel`
(the write dispatch) so each rule reads, and can be tested, on its own.
"""

from __future__ import annotations

import errno
import os
from fractions import Fraction
from functools import cache

from mdev_manager import catalog
from mdev_manager.catalog import TypeSpec
from mdev_manager.sim.nvml import free_instances, mig_enabled, rooms
from mdev_manager.sim.slots import mixed


def err(code: int, what: str) -> OSError:
    """The error a kernel write fails with: ``errno`` and its message."""
    return OSError(code, f"{os.strerror(code)}: {what}")


def kstrtoul(raw: str) -> int:
    """The kernel's kstrtoul with base 0: decimal, 0x hex or 0 octal, one trailing newline."""
    text = raw[:-1] if raw.endswith("\n") else raw
    try:
        if text.lower().startswith("0x"):
            return int(text[2:], 16)
        if len(text) > 1 and text.startswith("0"):
            return int(text[1:], 8)
        if not text.isdigit():
            raise ValueError(text)
        return int(text)
    except ValueError:
        raise err(errno.EINVAL, f"{raw!r} is not a number") from None


@cache
def type_index(board_key: str) -> dict[str, TypeSpec]:
    """A board's types by mdev type id and by vendor-VFIO number (the catalog never changes)."""
    board = catalog.board(board_key)
    index: dict[str, TypeSpec] = {}
    for t in board.types:
        index.setdefault(t.mdev_id(board.driver), t)
        index.setdefault(str(t.num), t)
    return index


@cache
def framebuffer(board_key: str, type_id: str) -> int | None:
    return type_index(board_key)[type_id].fb_mib


@cache
def type_facts(board_key: str) -> tuple[tuple[str, str, TypeSpec, int | None], ...]:
    """(mdev type id, number, spec, framebuffer MiB) of each of a board's types, in catalog order."""
    board = catalog.board(board_key)
    return tuple((t.mdev_id(board.driver), str(t.num), t, t.fb_mib) for t in board.types)


def vf_address(pf: str, n: int, offset: int = 4) -> str:
    """VF n of a PF at devfn offset 4, stride 1 (as NVIDIA boards report)."""
    dom, bus, rest = pf.split(":")
    devfn = int(rest.split(".")[0], 16) * 8 + int(rest.split(".")[1]) + offset + n
    return f"{dom}:{bus}:{devfn >> 3:02x}.{devfn & 7}"


def remaining(gpu: dict, t: TypeSpec, used: Fraction, sizes: set, fb: int | None, placements_left: int) -> int:
    """How many more of ``t`` (framebuffer ``fb``) fit beside vGPUs taking ``used``, of ``sizes``.

    In mixed-size mode only placements limit a type: ``placements_left``, its creatable placements
    (:mod:`.slots`). In NVIDIA's equal-size mode (the default) each vGPU of type t takes
    1/max(t) of the GPU and a second framebuffer size does not fit at all; Intel GVT-g has no
    such mode (shares only). In MIG mode only MIG-backed types are creatable, one per free GPU
    instance of their profile; out of it, none of them (NVIDIA vGPU user guide, "MIG-backed
    vGPUs": the GPU instance is created first).
    """
    if mig_enabled(gpu) or t.mig_backed:
        if not (t.mig_backed and mig_enabled(gpu)):
            return 0
        if t.max_per_instance:  # MIG time-slicing: the free placements inside the instances
            return sum(len(free) for _, free in rooms(gpu, t))
        return len(free_instances(gpu, t.gpu_instance_profile or ""))
    if mixed(gpu):
        return placements_left
    if catalog.board(gpu["board"]).vendor_id == "0x10de" and sizes - {fb}:
        return 0
    return max(0, int((1 - used) * t.max_instances))
