"""Who uses a vGPU or GPU right now, so the manager never pulls one out from under a VM.

Two independent witnesses: processes holding a ``/dev/vfio/<group>`` open (QEMU in a
virt-launcher pod, or anything else) or, with iommufd, a device's own vfio cdev
``/dev/vfio/devices/vfioN`` (which names no group: it is mapped to its mdev or PCI function
through sysfs), and libvirt domains whose XML references an mdev
UUID or PCI address (running or merely defined). The DRA bridge adds a third witness,
kubelet allocations, through ``collect_usage(extra=...)``. A libvirt that was asked for
(``--libvirt-uri``) and cannot be read (libvirt-python missing, libvirtd down) names nothing it
can be shown not to: every existing vGPU and passed-through GPU counts as named by it
(:func:`libvirt_unknown`), so a plan keeps them until it can be read.

A held PCI function also holds the functions that answer for it (:func:`_credited`): every other
function of its IOMMU group (the GPU behind its audio function) and, for a VF, its PF. The planner
asks about the GPU, not about the function the VM happened to open.

The facts come from the host layer (:mod:`mdev_manager.host.procfs` reads ``/proc``
through ``HostIO``, so a simulated host's processes count as a real one's); this module
decides what they mean. The result types live in :mod:`mdev_manager.models`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pydantic import BaseModel

from mdev_manager.host import procfs
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.models import CdevHolder, Holder, Inventory, Usage, add_unique
from mdev_manager.names import NameError_, check_pci_address

log = logging.getLogger(__name__)


# --- open VFIO groups and device cdevs -----------------------------------------------------------------

def scan_vfio_holders(env: HostEnv, io: HostIO) -> dict[int, list[Holder]]:
    """Map VFIO group number -> processes with ``<dev_root>/vfio/<group>`` open (see
    :func:`mdev_manager.host.procfs.vfio_holders`)."""
    return _group_holders(procfs.vfio_holders(env, io))


def _group_holders(groups: dict[int, list[procfs.Proc]]) -> dict[int, list[Holder]]:
    return {g: [Holder(pid=p.pid, comm=p.comm) for p in procs] for g, procs in groups.items()}


def _cdev_holders(env: HostEnv, io: HostIO, cdevs: dict[str, list[procfs.Proc]],
                  warnings: list[str]) -> dict[str, list[CdevHolder]]:
    """Device (mdev UUID or PCI address) -> processes holding its vfio cdev.

    A held cdev whose device cannot be told is a warning, never silence: something is in use.
    """
    out: dict[str, list[CdevHolder]] = {}
    for cdev, procs in sorted(cdevs.items()):
        node = str(env.vfio_cdev_dir / cdev)
        device = procfs.cdev_device(env, io, cdev)
        if device is None:
            who = ", ".join(f"pid {p.pid} ({p.comm})" for p in procs)
            msg = f"{who} holds {node}, but {env.vfio_dev_class / cdev / 'device'} does not say which device it is"
            log.warning(msg)
            warnings.append(msg)
            continue
        out.setdefault(device, []).extend(CdevHolder(pid=p.pid, comm=p.comm, node=node) for p in procs)
    return out


def _credited(env: HostEnv, io: HostIO, groups: dict[int, list[procfs.Proc]],
              cdevs: dict[str, list[CdevHolder]]) -> dict[str, list[CdevHolder]]:
    """The holders of a PCI function, credited to the functions that answer for it.

    * Its IOMMU group's other functions: the group, not the function, is vfio's unit of
      ownership. With ``/dev/vfio/<group>`` open the whole group is held (``Usage.pci_users``
      already asks about the GPU's group); a cdev names one function, yet "vfio device cdev
      access is still bound by IOMMU group semantics, ie. there can be only one DMA owner for the
      group. Devices belonging to the same group can not be [...] shared between native kernel
      and vfio bus driver" (Documentation/driver-api/vfio.rst, "VFIO Device cdev"). A VM holding
      the GPU's audio function 0000:xx:00.1 therefore holds the GPU: returning the GPU to its
      native driver would fail at probe (the group's DMA owner is the user) and leave it driverless.
    * A VF's PF: disabling SR-IOV (``sriov_numvfs`` 0) or rebinding the PF removes every VF,
      the held one too.

    mdevs are left alone: each has an IOMMU group of its own, and its users are the vGPU's.
    """
    out: dict[str, list[CdevHolder]] = {}
    for device, holders in sorted(cdevs.items()):
        try:
            address = check_pci_address(device)
        except NameError_:
            continue  # an mdev
        rel = procfs.related_functions(env, io, address)
        for mate in rel.group_mates:
            add_unique(out, mate, (h.model_copy(update={"node": f"{h.node} of {address}, in IOMMU group {rel.group} with it"})
                          for h in holders))
        if rel.physfn:
            add_unique(out, rel.physfn, (h.model_copy(update={"node": f"{h.node} of its VF {address}"}) for h in holders))
    for group, procs in sorted(groups.items()):
        for member in procfs.group_members(env, io, group):
            if (pf := procfs.physfn(env, io, member)) is not None:
                node = f"{env.vfio_group(group)} of its VF {member}"
                add_unique(out, pf, (CdevHolder(pid=p.pid, comm=p.comm, node=node) for p in procs))
    return out


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
    import xml.etree.ElementTree as ET  # only where libvirt names domains: apply on a host without it loads none

    root = ET.fromstring(xml)
    mdevs: set[str] = set()
    pci: set[str] = set()
    for hd in root.iterfind("./devices/hostdev"):
        if hd.get("mode", "subsystem") != "subsystem":
            continue
        addr = hd.find("./source/address")
        if addr is None:
            continue
        if hd.get("type") == "mdev" and (uuid := addr.get("uuid")):
            mdevs.add(uuid.strip().lower())
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
        import libvirt  # optional dependency (the [libvirt] extra)
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

def _domain_label(name: str, active: bool) -> str:
    return f"libvirt domain {name}" + ("" if active else " (not running)")


def libvirt_unknown(inv: Inventory, uri: str) -> Usage:
    """Every device a plan could remove or change (each vGPU, each GPU on vfio-pci), as named by a
    libvirt domain: what the unreadable libvirt at ``uri`` may hold cannot be told apart."""
    who = [f"an unreadable libvirt ({uri}) perhaps"]  # said as "... perhaps references it"
    mdevs = {v.id.lower(): who for v in inv.all_vgpus() if v.framework == "mdev"}
    pci = {v.id.lower(): who for v in inv.all_vgpus() if v.framework != "mdev"}
    pci |= {g.address: who for g in inv.gpus if g.driver == "vfio-pci"}
    return Usage(mdevs=mdevs, pci=pci)


def collect_usage(env: HostEnv, io: HostIO, extra: Usage | None = None, inv: Inventory | None = None) -> Usage:
    """One view of device users on this host: open VFIO groups and cdevs, libvirt domains, ``extra``.

    ``inv``: the node a plan is made for; where libvirt was asked for and cannot be read, each of its
    existing devices counts as named by a domain (:func:`libvirt_unknown`): removing a device a domain
    names because the domains could not be listed breaks the domain for good."""
    warnings: list[str] = []
    if not io.is_dir(env.proc_root):
        msg = f"{env.proc_root} is not readable; open VFIO groups not checked"
        log.warning(msg)
        warnings.append(msg)
    held = procfs.scan(env, io)
    vfio_devices = _cdev_holders(env, io, held.cdevs, warnings)
    for address, holders in _credited(env, io, held.groups, vfio_devices).items():
        add_unique(vfio_devices, address, holders)
    uri = env.libvirt_uri
    lv = libvirt_devices(uri)
    if lv.warning and inv is not None and uri is not None:
        warnings.append(f"{lv.warning}; until libvirt can be read, no existing vGPU or passed-through GPU is "
                        "removed or changed")
        extra = libvirt_unknown(inv, uri).merged(extra)
    elif lv.warning:
        warnings.append(lv.warning)
    usage = Usage(
        vfio_groups=_group_holders(held.groups),
        vfio_devices=vfio_devices,
        mdevs={k: [_domain_label(d, lv.active.get(d, True)) for d in v] for k, v in lv.mdevs.items()},
        pci={k: [_domain_label(d, lv.active.get(d, True)) for d in v] for k, v in lv.pci.items()},
        warnings=warnings,
        vfio_dir=str(env.vfio_dir),
    )
    return usage.merged(extra)
