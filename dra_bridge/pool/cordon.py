"""What a cordon does to the published pool: the GPUs an admin took out of service take no new
allocation, and nothing a claim holds disappears. Pure, no I/O.

The cordon is a node annotation (:data:`~dra_bridge.api.names.ANNOTATION_CORDON`) that ``vgpuctl
cordon`` writes and the agent reads: a JSON object from a GPU's PCI address (or ``*``, every GPU of
the node) to ``{"effect", "since", "reason", "index"}``. Where the API server keeps device taints
(KEP-5055; found by effect, :attr:`~dra_bridge.api.compat.KeptFields.taints`) every device of a
cordoned GPU is published with the taint :data:`~dra_bridge.api.names.TAINT_KEY_CORDON`, so the
scheduler allocates none of them to a claim that does not tolerate it, and ``NoExecute`` lets the
cluster's device-taint controller evict. Elsewhere (1.34 and 1.35 default gates) the GPU's free
devices are withdrawn from the slices: the scheduler cannot allocate what is not published. A
device a prepared claim holds stays published either way, so its claim keeps its device and the
counters it consumes stay accounted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from dra_bridge.api.compat import TAINT_EFFECTS
from dra_bridge.api.names import TAINT_KEY_CORDON

if TYPE_CHECKING:  # pydantic: the agent's, not kubectl vgpu's
    from dra_bridge.pool.model import Pool

NODE = "*"  # the key of a whole-node cordon
NO_SCHEDULE, NO_EXECUTE = TAINT_EFFECTS


@dataclass(frozen=True)
class CordonEntry:
    """One cordoned GPU (or the whole node): the taint effect, when and why, the GPU's index."""

    effect: str = NO_SCHEDULE
    since: str | None = None  # RFC 3339, the taint's timeAdded
    reason: str | None = None
    index: int | None = None  # the GPU's gpuIndex when cordoned: to name it back once its devices are gone

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


Cordon = dict[str, CordonEntry]


def parse_cordon(text: str | None) -> Cordon:
    """The annotation's value; ``None`` or empty: nothing cordoned. Raises ValueError on a bad value
    (the agent then keeps its last good view: a typo must not uncordon a GPU)."""
    if not text or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"cordon annotation is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("cordon annotation: expected an object of PCI address (or *) -> {effect, since, reason}")
    out: Cordon = {}
    for key, value in data.items():
        value = value if isinstance(value, dict) else {}
        effect = value.get("effect", NO_SCHEDULE)
        if effect not in TAINT_EFFECTS:
            raise ValueError(f"cordon annotation: {key}: effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
        index = value.get("index")
        out[str(key).lower()] = CordonEntry(effect=effect, since=value.get("since"), reason=value.get("reason"),
                                            index=index if isinstance(index, int) else None)
    return out


def format_cordon(cordon: Mapping[str, CordonEntry]) -> str | None:
    """The annotation's value for ``cordon`` (None: remove the annotation)."""
    if not cordon:
        return None
    return json.dumps({k: cordon[k].to_dict() for k in sorted(cordon)}, separators=(",", ":"), sort_keys=True)


def entry_for(cordon: Mapping[str, CordonEntry], gpu: str) -> CordonEntry | None:
    """The cordon in force for GPU ``gpu``: its own or the node's; NoExecute wins over NoSchedule."""
    found = [e for e in (cordon.get(gpu.lower()), cordon.get(NODE)) if e is not None]
    if not found:
        return None
    return max(found, key=lambda e: e.effect == NO_EXECUTE)


def taint(entry: CordonEntry) -> dict[str, str]:
    """The device taint of a cordoned GPU (``timeAdded`` from the cordon, so a republish is equal)."""
    out = {"key": TAINT_KEY_CORDON, "effect": entry.effect}
    if entry.since:
        out["timeAdded"] = entry.since
    return out


@dataclass
class CordonEffect:
    """What the published pool does for the cordon, per GPU address."""

    tainted: dict[str, int] = field(default_factory=dict)  # devices published with the taint
    withdrawn: dict[str, int] = field(default_factory=dict)  # free devices left out
    kept: dict[str, int] = field(default_factory=dict)  # held devices still published (withdrawal only)

    def describe(self) -> str:
        parts = [f"GPU {g}: {n} devices tainted" for g, n in sorted(self.tainted.items())]
        parts += [f"GPU {g}: {n} free devices withdrawn" + (f", {self.kept[g]} held kept" if self.kept.get(g) else "")
                  for g, n in sorted(self.withdrawn.items())]
        return "; ".join(parts) or "nothing cordoned"


def cordoned_pool(pool: Pool, cordon: Mapping[str, CordonEntry], *, taints: bool,
                  in_use: Iterable[str] = ()) -> tuple[Pool, CordonEffect]:
    """The pool to publish: ``pool`` with every device of a cordoned GPU tainted (``taints``: the
    server keeps device taints), or without its free devices (devices named in ``in_use`` stay).
    ``pool`` itself is left as it is: prepare looks devices up there, so a claim allocated just
    before the cordon is still prepared."""
    effect = CordonEffect()
    if not cordon:
        return pool, effect
    held = set(in_use)
    devices = []
    for d in pool.devices:
        entry = entry_for(cordon, d.gpu)
        if entry is None:
            devices.append(d)
        elif taints:
            devices.append(d.model_copy(update={"taints": [*d.taints, taint(entry)]}))
            effect.tainted[d.gpu] = effect.tainted.get(d.gpu, 0) + 1
        elif d.name in held:
            devices.append(d)
            effect.kept[d.gpu] = effect.kept.get(d.gpu, 0) + 1
        else:
            effect.withdrawn[d.gpu] = effect.withdrawn.get(d.gpu, 0) + 1
    return pool.model_copy(update={"devices": devices}), effect


def withheld_classic(gpus: Iterable[tuple[str, Iterable[str]]], cordon: Mapping[str, CordonEntry],
                     in_use: Iterable[str] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """The device plugin's side of a cordon (``gpus``: each GPU's address and its advertised devices' ids):
    the cordoned GPUs, address -> why, and of their devices the free ones, id -> why. The kubelet counts
    an Unhealthy device out of the Node's allocatable, so no new pod is admitted on it, while a pod that
    holds one (named in ``in_use``) keeps it, as a held DRA device stays published."""
    held = {i.lower() for i in in_use}
    cordoned: dict[str, str] = {}
    devices: dict[str, str] = {}
    for gpu, ids in gpus:
        entry = entry_for(cordon, gpu)
        if entry is None:
            continue
        why = f"GPU {gpu} is cordoned ({entry.effect}{': ' + entry.reason if entry.reason else ''}): no new pods"
        cordoned[gpu] = why
        devices.update({i: why for i in ids if i.lower() not in held})
    return cordoned, devices
