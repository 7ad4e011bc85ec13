"""What the kernel shows wrong on a GPU bound to vfio-pci (issue #40, point 3). Pure, no I/O.

NVML does not see a passed-through GPU; the PCI core does. Per GPU the agent reads (sysfs, under
``/sys/bus/pci/devices/<address>/``, as Linux's Documentation/ABI/testing/sysfs-bus-pci and
sysfs-bus-pci-devices-aer_stats describe them) and this module decides:

* ``config`` (binary): the first bytes of the function's config space. A vendor id of ``0xffff`` is
  what a function that no longer answers reads (a PCI read to nothing returns all ones): the GPU fell
  off the bus, or the kernel marked it disconnected after a failed recovery -> ``gpu-lost``, and
  nothing else is judged from that read (link status then reads all ones too: width 63, "Unknown").
* ``aer_dev_fatal``, ``aer_dev_nonfatal`` (Linux 4.19+): one ``NAME COUNT`` line per uncorrectable
  error type and a last ``TOTAL_ERR_FATAL`` / ``TOTAL_ERR_NONFATAL`` line (the ABI notes the total may
  differ from the sum: several errors can share one message). Counters only grow; any of them growing
  since the last read is an event -> ``aer`` (value ``fatal`` or ``nonfatal``), lifted after the quiet
  period as an Xid is. The counters count from the function's enumeration (boot or hot-plug), not from
  its bind, and nothing else reports them: a counter already non-zero at the watch's first read (a GPU
  just bound to vfio-pci, or found there when the agent starts) is an error on this boot that nobody
  has reported, so it is reported too, its message saying it was found at the first look, and lifted
  after the quiet period if it does not grow. An agent restart says it once more: a repeat, never a miss
  (an error raised between the bind and the first read cannot be told from an older one). The ABI
  warns the errors may be counted at the link partner (the root port) instead: only the GPU's own
  counters are read here.
* ``current_link_width`` against what it was when the watch first read it -> ``pci-link``. Not against
  ``max_link_width``: that is the card's capability, and a x16 card in a x8 slot trains x8 for good.
  ``current_link_speed`` "Unknown" (Linux prints it when the link status names no speed: the link is
  down) -> ``pci-link`` too. A lower speed alone is not a fault: NVIDIA's driver (in the guest, for a
  passed-through GPU) lowers the link speed itself when the GPU idles, and raises it under load.
* ``reset_method`` (Linux 5.15+): the reset methods the kernel will use for the function, space
  separated. The kernel keeps no record of a reset that failed; what a failed function reset leaves
  that a reader can see is a function that no longer answers (``gpu-lost`` above), or a function
  whose methods are gone: a list that was not empty at the first read and is empty now ->
  ``pci-reset`` (vfio-pci cannot reset the GPU between VMs, so the next VM would inherit the last
  one's state). A list empty from the start is the board's (no FLR, a shared slot), never a fault.

A GPU none of whose files can be read is ``unmonitored``, as one whose NVML calls fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from dra_bridge.pool.health import GPU_LOST, KINDS, UNMONITORED, Problem

AER, PCI_LINK, PCI_RESET = KINDS[3:]
#: the bytes of config space read: vendor id (offset 0) and device id (offset 2), little-endian
CONFIG_HEAD = 4
_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")


@dataclass(frozen=True)
class PciReading:
    """The raw sysfs files of one GPU's function, as read (None: missing or unreadable)."""

    config: bytes | None = None
    aer_dev_fatal: str | None = None
    aer_dev_nonfatal: str | None = None
    current_link_speed: str | None = None
    current_link_width: str | None = None
    max_link_speed: str | None = None
    max_link_width: str | None = None
    reset_method: str | None = None

    def unreadable(self) -> bool:
        return all(v is None for v in (self.config, self.aer_dev_fatal, self.aer_dev_nonfatal,
                                       self.current_link_speed, self.current_link_width, self.reset_method))


#: the sysfs attributes (text) read into a PciReading, besides ``config``
TEXT_FILES = ("aer_dev_fatal", "aer_dev_nonfatal", "current_link_speed", "current_link_width",
              "max_link_speed", "max_link_width", "reset_method")


@dataclass(frozen=True)
class PciSeen:
    """What the watch remembers of a GPU between reads: the AER counters of the last read, the link
    width and reset methods of the first."""

    fatal: dict[str, int] | None = None
    nonfatal: dict[str, int] | None = None
    width: int | None = None
    resets: str | None = None


def aer_counts(text: str | None) -> dict[str, int] | None:
    """``NAME COUNT`` lines (the name may hold spaces) -> {name: count}; None when there is no such line."""
    if text is None:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if name and count.isdigit():
            out[name.strip()] = int(count)
    return out or None


def link_speed(text: str | None) -> float | None:
    """GT/s from ``8.0 GT/s PCIe`` (older kernels: ``8 GT/s``); 0.0 for ``Unknown`` (no speed: the link
    is down); None when unreadable."""
    if text is None:
        return None
    m = _SPEED.match(text)
    return float(m.group(1)) if m else (0.0 if text.strip().lower().startswith("unknown") else None)


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def fell_off(config: bytes | None) -> bool:
    return config is not None and len(config) >= 2 and config[:2] == b"\xff\xff"


def _grew(kind: str, before: dict[str, int] | None, now: dict[str, int] | None) -> str | None:
    """Which counters grew since the last read (``before`` None: the first read of them, so since boot),
    for people (``Completion Timeout +1``); None if none."""
    if now is None:
        return None
    first, before = before is None, before or {}
    grew = [f"{n} {'' if first else '+'}{c - before.get(n, 0)}" for n, c in now.items() if c > before.get(n, 0)]
    if not grew:
        return None
    named = [g for g in grew if not g.startswith("TOTAL_")] or grew
    if first:
        return f"{kind} AER errors counted since boot or hot-plug, found at the watch's first look ({', '.join(named)})"
    return f"{kind} AER errors reported ({', '.join(named)})"


def pci_problems(reading: PciReading, seen: PciSeen | None) -> tuple[list[Problem], PciSeen]:
    """What ``reading`` shows wrong, given what was ``seen`` before (None: the first read of this GPU);
    returns the problems and what to remember for the next read."""
    if reading.unreadable():
        return [Problem(UNMONITORED, "its health cannot be read (no PCI config, AER or link file in sysfs)")], \
            seen or PciSeen()
    if fell_off(reading.config):
        return [Problem(GPU_LOST, "its PCI config space reads all ones (vendor id 0xffff): "
                                  "the GPU fell off the bus")], seen or PciSeen()
    seen = seen or PciSeen()
    found: list[Problem] = []
    fatal, nonfatal = aer_counts(reading.aer_dev_fatal), aer_counts(reading.aer_dev_nonfatal)
    grew = [g for g in (_grew("fatal", seen.fatal, fatal), _grew("non-fatal", seen.nonfatal, nonfatal)) if g]
    if grew:
        found.append(Problem(AER, "; ".join(grew), "fatal" if grew[0].startswith("fatal") else "nonfatal"))
    width, speed = _int(reading.current_link_width), link_speed(reading.current_link_speed)
    base = seen.width if seen.width is not None else (width if speed else None)  # a link up at the first read
    if speed == 0.0:
        found.append(Problem(PCI_LINK, "the PCIe link is down (link speed Unknown)"))
    elif width is not None and base is not None and width < base:
        speed_text = (reading.current_link_speed or "?").strip()
        found.append(Problem(PCI_LINK, f"the PCIe link dropped to x{width} from x{base}"
                                       f" (max x{reading.max_link_width or '?'}, speed {speed_text})"))
    resets = seen.resets if seen.resets is not None else reading.reset_method
    if resets is not None and resets.strip() and reading.reset_method is not None and not reading.reset_method.strip():
        found.append(Problem(PCI_RESET, f"the kernel lists no reset method for it any more (was: {resets.strip()}): "
                                        "it cannot be reset between VMs"))
    return found, replace(seen, fatal=fatal if fatal is not None else seen.fatal,
                          nonfatal=nonfatal if nonfatal is not None else seen.nonfatal, width=base, resets=resets)
