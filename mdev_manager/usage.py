"""Who uses a vGPU or GPU right now, so the manager never pulls one out from under a VM.

Two independent witnesses: processes holding a ``/dev/vfio/<group>`` open (QEMU in a
virt-launcher pod, or anything else), and libvirt domains whose XML references an mdev
UUID or PCI address (running or merely defined). The DRA bridge adds a third witness,
kubelet allocations, through ``collect_usage(extra=...)``.

``/proc`` is read with ``os`` directly rather than through ``HostIO``: it is always the
real kernel's, and scanning thousands of fds must stay cheap.
"""

from __future__ import annotations

import logging
import os
import stat
import xml.etree.ElementTree as ET
from typing import Iterable

from pydantic import BaseModel

from mdev_manager.host.env import HostEnv
from mdev_manager.names import NameError_, check_pci_address

log = logging.getLogger(__name__)


class Holder(BaseModel):
    pid: int
    comm: str


# --- /proc scan ----------------------------------------------------------------------

def _identity(st: os.stat_result) -> tuple:
    """Device nodes compare by device number (a container's /dev has its own inodes for
    the same node); anything else (test files) by inode."""
    if stat.S_ISCHR(st.st_mode):
        return ("chr", st.st_rdev)
    return ("ino", st.st_dev, st.st_ino)


def _group_identities(env: HostEnv) -> dict[tuple, int]:
    out: dict[tuple, int] = {}
    try:
        entries = list(os.scandir(env.vfio_dir))
    except OSError:
        return out
    for e in entries:
        if e.name.isdigit():
            try:
                out[_identity(os.stat(e.path))] = int(e.name)
            except OSError:
                pass
    return out


def _read_comm(proc_dir: str) -> str | None:
    try:
        with open(os.path.join(proc_dir, "comm"), "r", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None  # exited meanwhile: it holds nothing any more
    except OSError:
        return "?"


def scan_vfio_holders(env: HostEnv) -> dict[int, list[Holder]]:
    """Map VFIO group number -> processes with ``<dev_root>/vfio/<group>`` open.

    An fd matches when its link target is that path (resolved), or, for processes in
    another mount namespace whose target reads ``.../vfio/<N>``, when it is the same
    device node or file. Processes that vanish or deny access are skipped.
    """
    vfio_dirs = {str(env.vfio_dir), os.path.realpath(env.vfio_dir)}
    identities: dict[tuple, int] | None = None  # built lazily: most hosts have no candidates
    held: dict[int, list[Holder]] = {}
    try:
        procs = list(os.scandir(env.proc_root))
    except OSError:
        return held
    for proc in procs:
        if not proc.name.isdigit():
            continue
        fd_dir = os.path.join(proc.path, "fd")
        groups: set[int] = set()
        try:
            with os.scandir(fd_dir) as fds:
                for fd in fds:
                    try:
                        target = os.readlink(fd.path)
                    except OSError:
                        continue
                    if target.endswith(" (deleted)"):
                        target = target[: -len(" (deleted)")]
                    head, _, name = target.rpartition("/")
                    if not name.isdigit() or not head.endswith("vfio"):
                        continue
                    if head in vfio_dirs:
                        groups.add(int(name))
                        continue
                    if identities is None:
                        identities = _group_identities(env)
                    try:
                        g = identities.get(_identity(os.stat(fd.path)))
                    except OSError:
                        continue
                    if g is not None:
                        groups.add(g)
        except OSError:  # exited, or not ours to look at
            continue
        if not groups:
            continue
        comm = _read_comm(proc.path)
        if comm is None:
            continue
        for g in groups:
            held.setdefault(g, []).append(Holder(pid=int(proc.name), comm=comm))
    for holders in held.values():
        holders.sort(key=lambda h: h.pid)
    return held


# --- libvirt -------------------------------------------------------------------------

class LibvirtUse(BaseModel):
    """Devices referenced by libvirt domains: mdev UUID / PCI address -> domain names."""

    mdevs: dict[str, list[str]] = {}
    pci: dict[str, list[str]] = {}
    active: dict[str, bool] = {}
    warning: str | None = None


def _pci_number(value: str | None) -> int:
    """libvirt parses these with base 0: ``0x65`` hex, ``010`` octal, ``65`` decimal."""
    if not value:
        return 0
    v = value.strip().lower()
    if v.startswith("0x"):
        return int(v, 16)
    if len(v) > 1 and v.startswith("0"):
        return int(v, 8)
    return int(v, 10)


def _pci_from_attrs(a: dict[str, str]) -> str | None:
    try:
        addr = (
            f"{_pci_number(a.get('domain')):04x}:{_pci_number(a.get('bus')):02x}:"
            f"{_pci_number(a.get('slot')):02x}.{_pci_number(a.get('function')):x}"
        )
        return check_pci_address(addr)
    except (ValueError, NameError_):
        return None


def parse_domain_devices(xml: str) -> tuple[set[str], set[str]]:
    """(mdev UUIDs, PCI addresses) a domain XML hands to its guest."""
    root = ET.fromstring(xml)
    mdevs: set[str] = set()
    pci: set[str] = set()
    for hd in root.iterfind("./devices/hostdev"):
        if hd.get("mode", "subsystem") != "subsystem":
            continue
        addr = hd.find("./source/address")
        if addr is None:
            continue
        if hd.get("type") == "mdev" and addr.get("uuid"):
            mdevs.add(addr.get("uuid").strip().lower())
        elif hd.get("type") == "pci":
            if (a := _pci_from_attrs(addr.attrib)) is not None:
                pci.add(a)
    # SR-IOV VFs handed over as <interface type='hostdev'> are PCI functions too.
    for addr in root.iterfind("./devices/interface[@type='hostdev']/source/address"):
        if addr.get("type", "pci") == "pci" and (a := _pci_from_attrs(addr.attrib)) is not None:
            pci.add(a)
    return mdevs, pci


def _warn(msg: str) -> LibvirtUse:
    log.warning(msg)
    return LibvirtUse(warning=msg)


def libvirt_devices(uri: str | None) -> LibvirtUse:
    """Devices every libvirt domain (running or defined) references; never raises.

    A failure returns an empty result with ``warning`` set, so callers can decide how
    cautious to be. ``uri=None`` skips libvirt silently (hosts without it, e.g. KubeVirt,
    whose libvirtd lives inside each virt-launcher pod).
    """
    if uri is None:
        return LibvirtUse()
    try:
        import libvirt  # type: ignore[import-not-found]
    except ImportError as e:
        return _warn(f"libvirt-python is not installed ({e}); libvirt domains not checked")
    try:
        conn = libvirt.openReadOnly(uri)
    except libvirt.libvirtError as e:
        return _warn(f"cannot connect to libvirt at {uri}: {e}")
    if conn is None:
        return _warn(f"cannot connect to libvirt at {uri}")
    out = LibvirtUse()
    try:
        for dom in conn.listAllDomains(0):
            try:
                name = dom.name()
                active = bool(dom.isActive())
                xmls = [dom.XMLDesc(0)]
                if active and dom.isPersistent():
                    # The next boot's config may name other devices than the live one.
                    xmls.append(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
            except libvirt.libvirtError as e:
                if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    continue  # undefined meanwhile: it uses nothing
                raise
            out.active[name] = active
            for x in xmls:
                mdevs, pci = parse_domain_devices(x)
                _add(out.mdevs, mdevs, name)
                _add(out.pci, pci, name)
    except Exception as e:  # a half-read answer must not look like "nothing in use"
        return _warn(f"cannot list libvirt domains at {uri}: {e}")
    finally:
        try:
            conn.close()
        except Exception:
            pass
    return out


def _add(table: dict[str, list[str]], keys: Iterable[str], user: str) -> None:
    for k in keys:
        users = table.setdefault(k, [])
        if user not in users:
            users.append(user)


# --- combined view -------------------------------------------------------------------

class Usage(BaseModel):
    """Everything known to use devices. Values of ``mdevs``/``pci`` are user labels such as
    ``libvirt domain vm1``; an empty answer from ``*_users`` means the device is free."""

    vfio_groups: dict[int, list[Holder]] = {}
    mdevs: dict[str, list[str]] = {}
    pci: dict[str, list[str]] = {}
    warnings: list[str] = []
    vfio_dir: str = ""

    def _group_users(self, group: int | None) -> list[str]:
        if group is None:
            return []
        node = f"{self.vfio_dir}/{group}" if self.vfio_dir else f"VFIO group {group}"
        return [f"pid {h.pid} ({h.comm}) holds {node}" for h in self.vfio_groups.get(group, [])]

    def mdev_users(self, uuid: str, iommu_group: int | None = None) -> list[str]:
        refs = self.mdevs.get(uuid.strip().lower(), [])
        return self._group_users(iommu_group) + [f"{r} references it" for r in refs]

    def pci_users(self, address: str, iommu_group: int | None = None) -> list[str]:
        try:
            address = check_pci_address(address)
        except NameError_:
            address = address.strip().lower()
        refs = self.pci.get(address, [])
        return self._group_users(iommu_group) + [f"{r} references it" for r in refs]

    def merged(self, other: "Usage | None") -> "Usage":
        """Union of two views (duplicates dropped, order kept)."""
        if other is None:
            return self.model_copy(deep=True)
        out = self.model_copy(deep=True)
        for g, holders in other.vfio_groups.items():
            mine = out.vfio_groups.setdefault(g, [])
            mine.extend(h for h in holders if h not in mine)
        for mine, theirs in ((out.mdevs, other.mdevs), (out.pci, other.pci)):
            for key, users in theirs.items():
                _add_all(mine, key, users)
        out.warnings.extend(w for w in other.warnings if w not in out.warnings)
        out.vfio_dir = out.vfio_dir or other.vfio_dir
        return out


def _add_all(table: dict[str, list[str]], key: str, users: Iterable[str]) -> None:
    cur = table.setdefault(key, [])
    cur.extend(u for u in users if u not in cur)


def _domain_label(name: str, active: bool) -> str:
    return f"libvirt domain {name}" + ("" if active else " (not running)")


def collect_usage(env: HostEnv, extra: Usage | None = None) -> Usage:
    """One view of device users on this host: open VFIO groups, libvirt domains, ``extra``."""
    warnings: list[str] = []
    if not os.path.isdir(env.proc_root):
        msg = f"{env.proc_root} is not readable; open VFIO groups not checked"
        log.warning(msg)
        warnings.append(msg)
    lv = libvirt_devices(env.libvirt_uri)
    if lv.warning:
        warnings.append(lv.warning)
    usage = Usage(
        vfio_groups=scan_vfio_holders(env),
        mdevs={k: [_domain_label(d, lv.active.get(d, True)) for d in v] for k, v in lv.mdevs.items()},
        pci={k: [_domain_label(d, lv.active.get(d, True)) for d in v] for k, v in lv.pci.items()},
        warnings=warnings,
        vfio_dir=str(env.vfio_dir),
    )
    return usage.merged(extra)
