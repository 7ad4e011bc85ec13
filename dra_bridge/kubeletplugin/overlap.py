"""One device, one claim: the check prepare runs before it makes anything (pure).

Split from :mod:`.driver`, which calls :func:`overlap` under its lock with the checkpoint's records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dra_bridge.kubeletplugin.state import ClaimRecord, PreparedDeviceRecord
from dra_bridge.pool.devices import Pool, PoolDevice
from dra_bridge.rpc.types import ClaimRef


def _owner(rec: ClaimRecord) -> str:
    name = f"{rec.namespace}/{rec.name}" if rec.namespace else "(name not recorded)"
    return f"claim {name} (uid {rec.uid})"


def overlap(ref: ClaimRef, results: list[dict], pool_name: str, pool: Pool,
            claims: dict[str, ClaimRecord], before: Mapping[str, PreparedDeviceRecord] | None = None) -> str | None:
    """Why ``ref`` may not take the devices allocated to it; None when no other claim holds them.

    Two claims allocated one device (a scheduler race, a pod force-deleted while its claim is
    still prepared here) must not both prepare: two vGPUs for one published slot, or one VM's
    GPU handed to another. NVIDIA's driver refuses the same (kubernetes-sigs/dra-driver-nvidia-gpu,
    cmd/gpu-kubelet-plugin/device_state.go, ``validateNoOverlappingPreparedDevices``; see
    kubernetes/kubernetes#136269). Decided differently here:

    * nothing is exempt: the pool never publishes ``allowMultipleAllocations`` (no shareable
      device, so no ``shareID``) and preparing makes the vGPU or binds the GPU, which cannot be
      shared, so ``adminAccess`` (exempt at NVIDIA) is not either;
    * every record holds its devices until its claim is unprepared: ``preparing`` ones (they may
      have made some) and those of an earlier boot (their claim re-creates them at its next
      prepare) too, where NVIDIA counts completed ones only and forgets them at a reboot;
    * "the same device" is physical: a passed-through GPU and a vGPU on it (or the GPU's
      passthrough device under another name) clash; both kinds of record name their GPU; so do
      two placements whose slots (mixed-size) or memory slices (MIG) overlap, read from the
      records, so a claim of an earlier boot keeps its placement before it is re-created; two vGPUs
      sharing one GPU instance (MIG time-slicing: the same profile, placement and type) clash only
      where their placements inside it overlap;
    * a record rebuilt without its vGPU's type inside a shared instance (:mod:`.places`: a placement
      id, no size) holds the whole instance, never less, except against a claim that shared that
      instance with it (``before``: the claim's own devices as recorded before a reboot took them,
      by name) and now makes its vGPU at a published placement that the held device's, as published,
      does not overlap: the two are made from one table of one type, as before the reboot (else two
      claims of one instance would refuse each other forever);
    * the claim's own record is not another claim (a repeated prepare answers before this runs);
      one device twice within the claim is refused too.
    """
    held = [_Held(_owner(rec), d.pool, d.device, d.kind, d.gpu, _record_span(d))
            for rec in claims.values() if rec.uid != ref.uid for d in rec.devices]
    for r in results:
        name, where = r.get("device"), r.get("pool")
        dev = pool.device(name or "") if where == pool_name else None
        kind, gpu = (dev.kind, dev.gpu) if dev else (None, None)
        span = _device_span(dev)
        for h in held:
            if (h.pool, h.name) == (where, name):
                why = f"device {name} is already {'allocated to' if h.mine else 'prepared for'} {h.who}"
            elif gpu and gpu == h.gpu and kind == "passthrough" and h.kind == "vgpu":
                why = f"device {name} is the whole GPU {gpu}, which holds vGPUs: {h.name} of {h.who}"
            elif gpu and gpu == h.gpu and h.kind == "passthrough":
                why = f"device {name} is on GPU {gpu}, which is passed through whole as {h.name} to {h.who}"
            elif gpu and gpu == h.gpu and span and h.span and _clash(span, h.span) \
                    and not _beside(span, h, (before or {}).get(name or ""), pool if where == h.pool else None):
                why = f"device {name} takes {_what(span, h.span, gpu)} of {h.name} {'in' if h.mine else 'prepared for'} {h.who}"
            else:
                continue
            if h.mine:
                return f"{why}; one device serves one request"
            return (f"{why}; one device serves one claim (allocated twice: a scheduler race or a force-deleted "
                    "pod), this one prepares once that claim is unprepared")
        held.append(_Held(f"request {r.get('request')} of this claim", where, name, kind, gpu, span, mine=True))
    return None


#: where a sharing vGPU sits inside its GPU instance: (GI profile id, type id, placement id, slots;
#: None where a rebuilt record does not know them: the whole instance)
_Inside = tuple[int | None, str | None, int, int | None]
#: what a placement is a range of: a mixed-size vGPU's slots, a MIG-backed vGPU's memory slices
#: (and its placement inside a shared instance)
_Span = tuple[str, int, int, _Inside | None]


def _clash(a: _Span, b: _Span) -> bool:
    if a[0] != b[0] or not (a[1] < b[2] and b[1] < a[2]):
        return False
    ia, ib = a[3], b[3]
    if ia is None or ib is None or a[1:3] != b[1:3] or ia[:2] != ib[:2]:
        return True  # overlapping instances, or one instance of two profiles or types
    if ia[3] is None or ib[3] is None:
        return True  # a placement of unknown size (a rebuilt record): the whole instance
    return ia[2] < ib[2] + ib[3] and ib[2] < ia[2] + ia[3]


def _beside(span: _Span, h: _Held, was: PreparedDeviceRecord | None, pool: Pool | None) -> bool:
    """Whether a device at ``span`` may be made beside ``h``, a record that holds a shared instance
    whole because its vGPU's size is not known: only for a claim that held a device of that name in
    that instance before (``was``), at a placement inside it that the device ``h`` names, as
    ``pool`` publishes it (what its claim makes when it prepares again), does not overlap."""
    held = h.span
    theirs = _device_span(pool.device(h.name or "")) if pool is not None else None
    if was is None or held is None or theirs is None:
        return False
    hi, mine, pub = held[3], span[3], theirs[3]
    if hi is None or hi[3] is not None or mine is None or pub is None:
        return False
    one_instance = span[:3] == held[:3] == theirs[:3] and mine[0] == hi[0] == pub[0] \
        and (was.gi_profile, was.gi_start) == (hi[0], span[1])
    return one_instance and pub[2] == hi[2] and not _clash(span, theirs)


def _what(span: _Span, theirs: _Span, gpu: str) -> str:
    """What ``span`` takes that ``theirs`` holds: a placement inside one shared instance, else the ranges."""
    a, b = span[3], theirs[3]
    if a and b and span[1:3] == theirs[1:3] and b[3] is None:
        return (f"the GPU instance at {span[0]} {span[1]}-{span[2] - 1} of GPU {gpu}, held whole (the size of its "
                f"vGPU at placement {b[2]} is not known since a rebuild) until its claim prepares again")
    if a and b and span[1:3] == theirs[1:3]:
        other = f"placement {b[2]}" if a[1] == b[1] else f"type {b[1]} at placement {b[2]}"
        return (f"placement {a[2]} inside the GPU instance at {span[0]} {span[1]}-{span[2] - 1} of GPU {gpu}, which "
                f"overlaps {other} inside it")
    return f"{span[0]} {span[1]}-{span[2] - 1} of GPU {gpu}, which overlap {theirs[1]}-{theirs[2] - 1}"


@dataclass(frozen=True)
class _Held:
    who: str
    pool: str | None
    name: str | None
    kind: str | None
    gpu: str | None
    span: _Span | None
    mine: bool = False


def _record_span(d: PreparedDeviceRecord) -> _Span | None:
    """The range a prepared device keeps on its GPU, from its record: a claim of an earlier boot
    holds it too, though its vGPU is not made again yet (else the first claim the kubelet retries
    after a reboot could take another's placement)."""
    if d.gi_start is not None:
        inside = (d.gi_profile, d.type_id, d.placement, d.placement_size) if d.placement is not None else None
        return ("memory slices", d.gi_start, d.gi_start + (d.gi_size or 1), inside)
    if d.placement is not None:
        return ("slots", d.placement, d.placement + (d.placement_size or 1), None)
    return None


def _device_span(dev: PoolDevice | None) -> _Span | None:
    if dev is None:
        return None
    if dev.slots is not None:
        return ("slots", dev.slots.start, dev.slots.start + dev.slots.size, None)
    if dev.placement is not None:
        inside = (dev.gpu_instance_profile, dev.type_id, dev.inside.start, dev.inside.size) if dev.inside else None
        return ("memory slices", dev.placement.start, dev.placement.start + dev.placement.size, inside)
    return None
