"""The node's GPU numbering: one record that every command numbering GPUs shares.

A layout's ``index: N``, the CLI's ``GPU N`` and the DRA driver's device names (``gpu-N-...``)
all mean the GPU this node numbered N. Positions in PCI order shift when a GPU leaves the bus
(or a new one joins before the others), so an ``index:`` entry would land on another GPU and
re-lay it out, destroying its vGPUs. The numbering is therefore kept, as the NVIDIA driver's
minor numbers are: whichever command sees a GPU first (``discover``, ``plan``, ``apply``,
``restore`` or the agent) numbers it after the ones already numbered (PCI order among GPUs seen
at once), the number never moves, and it is never handed to another GPU.

One file, ``<state-root>/gpu-ids.json``: ``{"version": 1, "gpus": {ADDRESS: {"number": N,
"vendor": ID}}}`` (the vendor tells which numbers an NVIDIA-only ``index`` counts once the GPU
is gone). Earlier releases kept ``{ADDRESS: N}`` in the DRA driver's data directory; that map is
read too, and adopted where the node's own file does not exist yet.

A file that cannot be read is never silently started again from scratch: numbering anew while a
GPU is off the bus is exactly the shift this record prevents, so it is refused, naming the file
and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO

VERSION = 1


@dataclass(frozen=True)
class Numbered:
    number: int
    vendor: str | None = None  # None: an earlier release's record, which did not keep it


class NumberingCorrupt(ValueError):
    """The numbering record cannot be read: which file, why, and the fix (one line for the CLI)."""


def parse(text: str, path: Path | str) -> dict[str, Numbered]:
    """The record in ``text`` (this release's or an earlier one's format); raises :class:`NumberingCorrupt`."""
    fix = ("restore it from a backup, or, with every GPU of the node on the bus, remove it to number the GPUs "
           "present again in PCI order")
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if "version" in data:
            if data["version"] != VERSION:
                raise ValueError(f"version {data['version']!r} is not known (this release reads {VERSION})")
            out = {addr: Numbered(int(v["number"]), v.get("vendor")) for addr, v in data["gpus"].items()}
        else:
            out = {addr: Numbered(int(v)) for addr, v in data.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise NumberingCorrupt(f"{path}: the GPU numbering cannot be read ({exc}); {fix}") from None
    numbers = [n.number for n in out.values()]
    if len(set(numbers)) != len(numbers) or any(n < 0 for n in numbers):
        raise NumberingCorrupt(f"{path}: the GPU numbering gives one number to two GPUs or a negative one; {fix}")
    return out


def load(env: HostEnv, io: HostIO, legacy: Path | None = None) -> dict[str, Numbered]:
    """The node's numbering ({} before any command numbered a GPU); ``legacy``: an earlier release's
    file, read (never written) when the node's own does not exist."""
    for path in (env.gpu_ids, legacy):
        if path is None:
            continue
        try:
            text = io.read(path)
        except FileNotFoundError:
            continue
        return parse(text, path)
    return {}


def adopt(env: HostEnv, io: HostIO, legacy: Path) -> None:
    """Take over an earlier release's numbering (the DRA driver's ``gpu-ids.json``) where the node
    has none of its own yet, so no device name moves on an upgrade."""
    if io.exists(env.gpu_ids) or not io.exists(legacy):
        return
    ids = load(env, io, legacy)
    io.makedirs(env.state_root)
    io.write_atomic(env.gpu_ids, dumps(ids))


def extend(ids: dict[str, Numbered], gpus: list[tuple[str, str]]) -> dict[str, Numbered]:
    """``ids`` with every GPU of ``gpus`` (address, vendor) it lacks numbered after the rest, in PCI
    order; a known GPU's vendor is filled in where an earlier release did not keep it. Pure."""
    out = dict(ids)
    for address, vendor in sorted(gpus):
        if address not in out:
            out[address] = Numbered(max((n.number for n in out.values()), default=-1) + 1, vendor)
        elif out[address].vendor is None:
            out[address] = Numbered(out[address].number, vendor)
    return out


def dumps(ids: dict[str, Numbered]) -> str:
    return json.dumps({"version": VERSION, "gpus": {a: {"number": n.number, "vendor": n.vendor}
                                                     for a, n in sorted(ids.items(), key=lambda i: i[1].number)}},
                      indent=2) + "\n"


def record(env: HostEnv, io: HostIO, gpus: list[tuple[str, str]]) -> dict[str, Numbered]:
    """Number the GPUs of ``gpus`` (address, vendor: discovery's, which already carries the numbers
    this gives) that the record lacks, and save it atomically when that changed it: whichever
    command sees a GPU first numbers it. Returns the numbering."""
    ids = load(env, io)
    out = extend(ids, gpus)
    if out != ids:
        io.makedirs(env.state_root)
        io.write_atomic(env.gpu_ids, dumps(out))
    return out
