"""What the kernel shows of a simulated GPU's PCI health, and the faults ``vgpuctl sim health`` raises there.

Each GPU function (not a VF) carries the files Linux keeps under ``/sys/bus/pci/devices/<address>/``
(Documentation/ABI/testing/sysfs-bus-pci, sysfs-bus-pci-devices-aer_stats): ``config`` (binary: the
config space header, vendor and device id little-endian first), ``aer_dev_correctable``,
``aer_dev_fatal``, ``aer_dev_nonfatal`` (a ``NAME COUNT`` line per error type, a ``TOTAL_ERR_*`` line
last), ``current_link_speed`` / ``max_link_speed`` (``16.0 GT/s PCIe``), ``current_link_width`` /
``max_link_width``, ``reset_method``. The faults change them as the hardware would look:

* ``aer-fatal`` / ``aer-nonfatal``: an uncorrectable error counted (Completion Timeout and the total
  grow by one). The kernel never lowers them while the function stays enumerated; clearing sets the
  file's counters back to 0, as a reboot or hot-plug would (the error was an event: what the agent
  raised for it lifts after its quiet period either way).
* ``link``: the link retrained narrower and slower (x8 at 8.0 GT/s); clearing restores it.
* ``fell-off``: the function no longer answers: config space reads all ones, and so does the link
  status (speed ``Unknown``, width 63); clearing brings it back.
* ``reset-failed``: the kernel lists no reset method any more; clearing restores ``flr``.
"""

from __future__ import annotations

import errno
from pathlib import Path

from mdev_manager.sim.rules import err

FAULTS = ("aer-fatal", "aer-nonfatal", "link", "fell-off", "reset-failed")
SPEED, WIDTH = "16.0 GT/s PCIe", "16"
DEGRADED = ("8.0 GT/s PCIe", "8")
RESET_METHODS = "flr bus"
#: the uncorrectable error names of aer_dev_fatal / aer_dev_nonfatal (the ABI's sample, in its order)
UNCORRECTABLE = ("Undefined", "Data Link Protocol", "Surprise Down Error", "Poisoned TLP", "Flow Control Protocol",
                 "Completion Timeout", "Completer Abort", "Unexpected Completion", "Receiver Overflow",
                 "Malformed TLP", "ECRC", "Unsupported Request", "ACS Violation", "Uncorrectable Internal Error",
                 "MC Blocked TLP", "AtomicOp Egress Blocked", "TLP Prefix Blocked Error")
CORRECTABLE = ("Receiver Error", "Bad TLP", "Bad DLLP", "RELAY_NUM Rollover", "Replay Timer Timeout",
               "Advisory Non-Fatal", "Corrected Internal Error", "Header Log Overflow")
_TOTAL = {"aer_dev_correctable": "TOTAL_ERR_COR", "aer_dev_fatal": "TOTAL_ERR_FATAL",
          "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL"}


def _header(vendor: str, device: str, cls: str) -> bytes:
    """The first 64 bytes of a type 0 config space header: ids, command/status, revision, class."""
    head = bytearray(64)
    head[0:2] = int(vendor, 16).to_bytes(2, "little")
    head[2:4] = int(device, 16).to_bytes(2, "little")
    head[9:12] = int(cls, 16).to_bytes(3, "little")
    return bytes(head)


def _aer(name: str, counts: dict[str, int]) -> str:
    names = CORRECTABLE if name == "aer_dev_correctable" else UNCORRECTABLE
    return "".join(f"{n} {counts.get(n, 0)}\n" for n in names) + f"{_TOTAL[name]} {counts.get(_TOTAL[name], 0)}\n"


def add_files(fdir: Path, vendor: str, device: str, cls: str) -> None:
    """A GPU function's health files, as at boot: config answering, no AER error, the link at its best."""
    (fdir / "config").write_bytes(_header(vendor, device, cls))
    for name in _TOTAL:
        (fdir / name).write_text(_aer(name, {}))
    for name, value in (("current_link_speed", SPEED), ("max_link_speed", SPEED), ("current_link_width", WIDTH),
                        ("max_link_width", WIDTH), ("reset_method", RESET_METHODS)):
        (fdir / name).write_text(value + "\n")


def _counts(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        name, _, count = line.rpartition(" ")
        out[name] = int(count)
    return out


def fault(fdir: Path, kind: str, *, clear: bool = False) -> None:
    """Raise (or ``clear``) one of :data:`FAULTS` on the GPU function whose directory is ``fdir``."""
    if not (fdir / "config").exists():
        raise err(errno.ENODEV, f"{fdir.name} has no PCI health files (a host built before they were simulated: "
                                "`vgpuctl sim reset` rebuilds it)")
    if kind in ("aer-fatal", "aer-nonfatal"):
        name = "aer_dev_fatal" if kind == "aer-fatal" else "aer_dev_nonfatal"
        counts = {} if clear else _counts(fdir / name)  # cleared: counted from 0 again, as after a re-enumeration
        if not clear:
            for key in ("Completion Timeout", _TOTAL[name]):
                counts[key] = counts.get(key, 0) + 1
        (fdir / name).write_text(_aer(name, counts))
        return
    if kind == "link":
        speed, width = (SPEED, WIDTH) if clear else DEGRADED
        _set(fdir, current_link_speed=speed, current_link_width=width)
    elif kind == "fell-off":
        if clear:
            ids = {n: (fdir / n).read_text().strip() for n in ("vendor", "device", "class")}
            (fdir / "config").write_bytes(_header(ids["vendor"], ids["device"], ids["class"]))
            _set(fdir, current_link_speed=SPEED, current_link_width=WIDTH)
        else:
            (fdir / "config").write_bytes(b"\xff" * 64)
            _set(fdir, current_link_speed="Unknown", current_link_width="63")
    elif kind == "reset-failed":
        _set(fdir, reset_method=RESET_METHODS if clear else "")
    else:
        raise ValueError(f"PCI health fault {kind!r}: choose one of {', '.join(FAULTS)}")


def _set(fdir: Path, **values: str) -> None:
    for name, value in values.items():
        (fdir / name).write_text(f"{value}\n" if value else "")  # reset_method with no method: empty
