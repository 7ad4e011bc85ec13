"""Mixed-size ("heterogeneous") vGPU placements of the boards whose tables are known. Pure.

In mixed-size mode a GPU is a row of 1 GiB slots (as many as its full-GPU profile has GiB); a
vGPU of ``size`` GiB holds slots ``[id, id + size)`` at one of its type's placement ids, and the
A, B, C and Q series of one size share those ids (../shared/reference/heterogeneous-vgpu.md).

The tables are computed by the driver's rule before Blackwell (NVIDIA open-gpu-kernel-modules,
``kernel_vgpu_mgr.c``): the slot row is halved into 1/2, 1/4, 1/8 and 1/16 partitions; a size
whose equal-size maximum is ``2 * partitions`` gets one placement at the start and one at the end
of each partition; a size whose maximum is not a power of two gets the largest power of two
below it, one placement per partition, at the start of left halves and the end of right halves.
So L40S-8C (maximum 6) sits at 0, 16, 24, 40 only, and at most 4 of it fit. tests check every
entry NVIDIA publishes (vGPU 19 user guide, via frankdenneman's vgpu-catalog.json).

Left out, on purpose (nothing is guessed):

* boards whose published table was not found (A16, A40, A10, A30, L20, H200, H20, T4, ...): they
  refuse mixed-size mode. The rule would give them a table, but the published tables are the only
  proof that a board follows it;
* 1 GiB types: the driver refuses some placements of some boards' 1 GiB profiles (it depends on the
  framebuffer it reserves per board, which is not published), so they are never placed here;

Blackwell and later (``_kvgpumgrSetHeterogeneousResources_GB100``, ../shared/reference/blackwell-vgpu.md
§0) follow another rule, :func:`blackwell`: placement id j = floor(slots * j / max) for j < max,
the same ids and maxima in equal-size and mixed-size mode (no power-of-two loss), and a 2 GiB
type on a 96-slot GPU holds 3 slots (the driver's special case for the RTX PRO 6000: 32 of them,
not 48). The same rule places MIG time-sliced vGPUs inside one GPU instance
(:func:`instance_placements`).

The node manager and the simulated NVML use NVML's own lists at run time; this module is what
the simulated host's driver knows and what the DRA side publishes before any vGPU exists.
"""

from __future__ import annotations

from functools import cache

from mdev_manager import catalog

SLOT_MIB = 1024  # one slot is 1 GiB; a vGPU's placementSize is its framebuffer in GiB

#: Boards placed by Blackwell's rule, read from the driver's code (no table is published).
BLACKWELL = ("RTX-PRO-6000-BSE", "RTX-PRO-4500-BSE")
#: Boards whose placements NVIDIA publishes (and the rule reproduces), and the Blackwell ones: catalog keys.
KNOWN = ("L40S", "L40", "L4", "H100-80GB", "H100-NVL", "A100-40GB", "A100D-80GB", *BLACKWELL)

_MAX_PARTITIONS = 16  # at most 32 vGPUs per GPU: two per 1/16 partition


def _prev_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def halving(slots: int, maxima: dict[int, int]) -> dict[int, tuple[int, ...]]:
    """Placement ids per size (GiB -> ids, ascending) on a ``slots`` GiB GPU before Blackwell.

    ``maxima``: each size's equal-size maximum count. Partitions split at ``(lo + hi) // 2``, as the
    driver does, so odd rows (the 94 GiB H100 NVL) get the driver's uneven halves.
    """
    out: dict[int, list[int]] = {size: [] for size in maxima}

    def walk(lo: int, hi: int, parts: int, left: bool) -> None:
        if parts > _MAX_PARTITIONS:
            return
        for size, most in maxima.items():
            pairs = parts * 2 == most
            single = (_prev_pow2(most) < most and _prev_pow2(most) == parts) or (parts == 1 and most == 1)
            if pairs or (single and left):
                out[size].append(lo)
            if pairs or (single and not left):
                out[size].append(hi - size)
        mid = (lo + hi) // 2
        walk(lo, mid, parts * 2, True)
        walk(mid, hi, parts * 2, False)

    walk(0, slots, 1, True)
    return {size: tuple(sorted(ids)) for size, ids in out.items()}


def placement_size(gib: int, region: int) -> int:
    """Slots a vGPU of ``gib`` GiB holds on Blackwell (``_kvgpumgrGetplacementSize``): its GiB, but
    3 for a 2 GiB profile on a 96 GiB region ("only 32 instances of 2GB are supported even
    though it can accommodate 48")."""
    return 3 if gib == 2 and region == 96 else gib


def blackwell(region: int, maxima: dict[int, int]) -> dict[int, tuple[int, ...]]:
    """Placement ids per size (GiB -> ids, ascending) on a ``region`` GiB GPU or GPU instance from
    Blackwell on: ``floor(region * j / max)`` for j < max, ``max`` each size's maximum count (per
    GPU instance for MIG time-slicing)."""
    return {size: tuple(region * j // most for j in range(most)) for size, most in maxima.items()}


def _sizes(board_key: str) -> dict[int, int]:
    """Each time-sliced framebuffer size (GiB) of a board and its equal-size maximum."""
    maxima: dict[int, int] = {}
    for t in catalog.board(board_key).types:
        fb = t.fb_mib
        if t.mig_backed or not fb or fb % SLOT_MIB:
            continue
        size = fb // SLOT_MIB
        if maxima.setdefault(size, t.max_instances) != t.max_instances:
            raise ValueError(f"{board_key}: {size} GiB types differ in their maximum count")
    return maxima


@cache
def slots(board_key: str) -> int:
    """Slots (GiB) of the board's GPU in mixed-size mode: its full-GPU profile's size; 0 when the
    board has no known table."""
    if board_key not in KNOWN:
        return 0
    return max(size for size, most in _sizes(board_key).items() if most == 1)


@cache
def placements(board_key: str) -> dict[int, tuple[int, ...]] | None:
    """Size (GiB) -> placement ids (first slots, ascending) in mixed-size mode; None for a board
    whose table is not known (it refuses mixed-size mode). 1 GiB sizes are left out."""
    if board_key not in KNOWN:
        return None
    rule = blackwell if board_key in BLACKWELL else halving
    table = rule(slots(board_key), _sizes(board_key))
    return {size: ids for size, ids in sorted(table.items()) if size > 1}


def type_placements(board_key: str, framebuffer_mib: int | None) -> tuple[int, ...]:
    """The placement ids of a type of ``framebuffer_mib``; () when it has none (unknown board or
    size, 1 GiB, MIG-backed)."""
    table = placements(board_key) or {}
    if not framebuffer_mib or framebuffer_mib % SLOT_MIB:
        return ()
    return table.get(framebuffer_mib // SLOT_MIB, ())


def slot_size(board_key: str, framebuffer_mib: int | None) -> int | None:
    """Slots a time-sliced vGPU of ``framebuffer_mib`` holds in mixed-size mode (its GiB, but see
    :func:`placement_size` on Blackwell); None for sizes that are not whole GiB."""
    if not framebuffer_mib or framebuffer_mib % SLOT_MIB:
        return None
    gib = framebuffer_mib // SLOT_MIB
    return placement_size(gib, slots(board_key)) if board_key in BLACKWELL else gib


def max_in_mixed_mode(board_key: str, framebuffer_mib: int | None) -> int:
    """How many vGPUs of a size fit at once in mixed-size mode: one per placement (placements
    of one size never overlap), so the largest power of two not above the equal-size maximum."""
    return len(type_placements(board_key, framebuffer_mib))


def instance_placements(board_key: str, t: catalog.TypeSpec) -> tuple[int, tuple[int, ...]]:
    """(slots held, placement ids) of a MIG time-sliced type inside one GPU instance (GB20x): the
    Blackwell rule over the instance's nominal GiB (the size of its profile's type that takes it
    whole, ``maxInstancePerGI == 1``: 24, 48 or 96 on the RTX PRO 6000) with the per-instance
    maximum. ``(0, ())`` for a type that takes its instance whole (B200, H100, ...)."""
    if not t.max_per_instance or not t.fb_mib:
        return 0, ()
    region = max((u.fb_mib or 0) // SLOT_MIB for u in catalog.board(board_key).types
                 if u.gpu_instance_profile == t.gpu_instance_profile and u.max_per_instance == 1)
    gib = t.fb_mib // SLOT_MIB
    return placement_size(gib, region), blackwell(region, {gib: t.max_per_instance})[gib]


def boards() -> tuple[str, ...]:
    """The catalog boards with a known table."""
    return KNOWN


__all__ = ["BLACKWELL", "KNOWN", "SLOT_MIB", "blackwell", "boards", "halving", "instance_placements", "max_in_mixed_mode",
           "placement_size", "placements", "slot_size", "slots", "type_placements"]
