"""The state of a simulated GPU host: its sysfs tree on disk, how it is built, and what it shows.

The tree under ``<root>/sys`` is the only state the manager sees: regular files for
attributes, relative symlinks for links, directories for devices; ``<root>/.sim/state.json``
keeps what the tree cannot say (board, framework, native driver of each function).
:class:`SysfsTree` builds the tree for a :class:`~.hostspec.HostSpec` (a cold boot) and changes
it as a device model does: binding a driver, adding VFs, making a function an mdev parent,
removing an mdev. It never refuses; the kernel's checks and errnos are in :mod:`.kernel`.

Capacity in NVIDIA's equal-size mode (the default) is occupancy: each vGPU of type t takes
1/max(t) of the GPU and a second framebuffer size does not fit (:func:`.rules.remaining`). In
mixed-size mode it is exact: vGPUs hold slots at placements (:mod:`.slots`). Every change
rewrites the GPU's ``available_instances`` / ``creatable_vgpu_types`` (:meth:`SysfsTree._refresh`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, Self

from mdev_manager import catalog
from mdev_manager.catalog import BoardSpec, TypeSpec
from mdev_manager.sim import pcihealth, slots, uevents
from mdev_manager.sim.hostspec import HostSpec
from mdev_manager.sim.locking import HostLocks
from mdev_manager.sim.procs import SimProcs, holding
from mdev_manager.sim.rules import framebuffer, remaining, type_facts, type_index, vf_address

ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
HEADER = "ID    : vGPU Name"

#: the state file's key while a host is being built: written first, removed by the build's last
#: (atomic) write, so a build that was interrupted is never opened as a whole host
BUILDING = "building"


class IncompleteHost(ValueError):
    """The simulated host under ``root`` was never finished (its build was interrupted): it is
    rebuilt, never used (a half-built tree reads as a host with fewer GPUs, or none)."""

    def __init__(self, root: Path, *, building: bool = False):
        self.root = Path(root)
        super().__init__(f"{root}: the simulated host is incomplete (its build was interrupted); rebuild it "
                         "with sim reset")


class SysfsTree(HostLocks):
    """The sysfs tree of a simulated host rooted at ``root`` (``sys/``, ``dev/``, ``proc/``, ``etc/``, ``.sim/``)."""

    #: remember the capacity files this object wrote (:meth:`_refresh_attr`): set by the kernel's own
    #: process (:mod:`.kproc`), which writes them all; off elsewhere, where its memory would be counted
    #: as the caller's (an in-process ``serve --simulate``)
    remember_attrs = False

    def __init__(self, root: Path, *, building: bool = False):
        self.root = Path(root)
        self.sys = self.root / "sys"
        self.dev = self.root / "dev"
        self._sys_real = os.path.realpath(self.sys)
        self._lock = threading.RLock()
        self._tls = threading.local()  # per thread: the node lock's depth, a GPU write's own copy of the state
        self._seen: dict[str, tuple[str, tuple[int, int]]] | None = {} if self.remember_attrs else None
        try:
            # JSON: what the tree cannot say
            self._state: dict[str, Any] = json.loads((self.root / ".sim/state.json").read_text())
        except FileNotFoundError:
            if (self.root / ".sim").is_dir():  # a build or removal that was interrupted
                raise IncompleteHost(self.root) from None
            raise
        except json.JSONDecodeError:  # torn by an interruption
            raise IncompleteHost(self.root) from None
        if self._state.get(BUILDING) and not building:
            raise IncompleteHost(self.root)
        self.procs = SimProcs(self.root)
        self.procs.dir.mkdir(exist_ok=True)  # hosts made before processes were simulated

    # ------------------------------------------------------------------ building
    @classmethod
    def create(cls, root: Path, spec: HostSpec, on_gpu: Callable[[], None] | None = None) -> Self:
        """Build a fresh tree for ``spec`` (a cold boot: no VFs unless asked, no vGPUs); ``on_gpu()``
        after each GPU (a progress bar: a big host takes seconds)."""
        root = Path(root)
        if (root / ".sim").exists():
            raise FileExistsError(f"{root} already holds a simulated host")
        (root / ".sim").mkdir(parents=True)
        state = {"spec": spec.model_dump(), "gpus": [], "functions": {}, "next_group": 1, "next_vfio": 0,
                 BUILDING: True}
        (root / ".sim/state.json").write_text(json.dumps(state))  # first: marks the build as not done
        for sub in ("sys/bus/pci/devices", "sys/bus/mdev/devices", "sys/bus/mdev/drivers/vfio_mdev",
                    "sys/class/mdev_bus", "sys/kernel/iommu_groups", "dev/vfio", "proc", "etc/mdevctl.d/scripts.d/callouts",
                    "etc/mdevctl.d/scripts.d/notifiers", ".sim"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "sys/bus/pci/drivers_probe").write_text("")
        (root / "dev/vfio/vfio").write_text("")
        if spec.iommufd:
            (root / "dev/iommu").write_text("")
            (root / "dev/vfio/devices").mkdir()
        host = cls(root, building=True)
        host._populate(spec, on_gpu or (lambda: None))
        del host.state[BUILDING]
        host._save()  # the last write, atomic: from here the host is whole
        return host

    @staticmethod
    def remove(root: Path) -> None:
        """Remove the host under ``root``: its state file first, so a removal that is interrupted
        leaves a host that is refused as incomplete, never one read as whole with parts missing."""
        root = Path(root)
        (root / ".sim/state.json").unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)

    @classmethod
    def open_or_create(cls, root: Path, spec: HostSpec) -> Self:
        """The host under ``root``, or a new one built for ``spec`` where there is none (a host whose
        build or removal was interrupted is refused: :class:`IncompleteHost`)."""
        return cls(root) if (Path(root) / ".sim").exists() else cls.create(root, spec)

    def _new_group(self) -> int:
        g = self._bump("next_group")
        (self.sys / f"kernel/iommu_groups/{g}/devices").mkdir(parents=True, exist_ok=True)
        return g

    def _populate(self, spec: HostSpec, on_gpu: Callable[[], None]) -> None:
        drivers = {"nvidia", "vfio-pci", "i915", "snd_hda_intel"}
        for d in drivers:
            ddir = self.sys / "bus/pci/drivers" / d
            ddir.mkdir(parents=True, exist_ok=True)
            for f in ("bind", "unbind", "new_id", "remove_id"):
                (ddir / f).write_text("")
        bus = 0x10
        for group in spec.gpus:
            board = catalog.board(group.board)
            framework = group.framework or board.framework
            for _ in range(group.count):
                for _ in range(board.gpus_per_board):
                    if board.vendor_id == "0x8086":
                        pf, rel = "0000:00:02.0", "devices/pci0000:00"
                    else:
                        pf = f"0000:{bus:02x}:00.0"
                        rel = f"devices/pci0000:{bus - 1:02x}/0000:{bus - 1:02x}:01.0"
                        bus += 3
                    native = board.driver
                    initial = group.driver or native
                    grp = self._new_group()
                    self._add_function(pf, rel, board.vendor_id, board.device_id, board.class_code,
                                       board.subsystem_vendor_id, board.subsystem_device_id,
                                       group.numa_node, grp, native)
                    self.state["functions"][pf]["initial"] = initial
                    gpu: dict[str, Any] = {"pf": pf, "board": board.key, "framework": framework, "mixed_size": False,
                           "placements": {}, "vf_total": board.sriov_total_vfs if framework != "mdev" else 0}
                    self.state["gpus"].append(gpu)
                    if gpu["vf_total"]:
                        self._write(self._fdir(pf) / "sriov_totalvfs", f"{gpu['vf_total']}\n")
                        self._write(self._fdir(pf) / "sriov_numvfs", "0\n")
                    if group.audio_function:
                        audio = pf[:-1] + "1"
                        self._add_function(audio, rel, board.vendor_id, "0x10f8", "0x040300",
                                           board.subsystem_vendor_id, board.subsystem_device_id,
                                           group.numa_node, grp, "snd_hda_intel")
                        self._bind(audio, "snd_hda_intel")
                    if initial != "none":
                        self._bind(pf, initial)
                    if group.vfs_enabled and gpu["vf_total"] and initial == "nvidia":
                        self._enable_vfs(gpu, gpu["vf_total"])
                    # set by the admin after boot (nvidia-smi vgpu -shm 1), after the VFs; a reboot clears it
                    gpu["mixed_size"] = group.mixed_size and initial == "nvidia"
                    if gpu["mixed_size"]:
                        self._refresh(gpu)
                    on_gpu()
        self._save()

    def _add_function(self, addr: str, rel: str, vendor: str, device: str, cls_: str, svendor: str, sdevice: str,
                      numa: int | None, grp: int, native: str, physfn: str | None = None) -> None:
        fdir = self.sys / rel / addr
        fdir.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", cls_),
                            ("subsystem_vendor", svendor), ("subsystem_device", sdevice),
                            ("numa_node", str(-1 if numa is None else numa)), ("driver_override", "(null)")):
            (fdir / name).write_text(value + "\n")
        if physfn is None:  # a GPU's (or its audio's) function: config space, AER counters, link, resets
            pcihealth.add_files(fdir, vendor, device, cls_)
        self._link(self.sys / "bus/pci/devices" / addr, fdir)
        self._link(fdir / "iommu_group", self.sys / f"kernel/iommu_groups/{grp}")
        self._link(self.sys / f"kernel/iommu_groups/{grp}/devices/{addr}", fdir)
        if physfn:
            self._link(fdir / "physfn", self._fdir(physfn))
        self.state["functions"][addr] = {"rel": f"{rel}/{addr}", "native": native, "group": grp}
        self._uevent("add", "pci", addr)

    # ------------------------------------------------------------------ helpers
    def _uevent(self, action: str, subsystem: str, addr: str, child: str = "", **env: str) -> None:
        """Announce a change of function ``addr`` (or of its ``child``, an mdev) as the kernel does."""
        devpath = "/" + self.state["functions"][addr]["rel"] + (f"/{child}" if child else "")
        uevents.send(self.root, action, subsystem, devpath, **env)

    def _fdir(self, addr: str) -> Path:
        return self.sys / self.state["functions"][addr]["rel"]

    def _link(self, link: Path | str, target: Path | str) -> None:
        link, target = os.fspath(link), os.fspath(target)
        rel = os.path.relpath(target, os.path.dirname(link))
        try:
            os.symlink(rel, link)
        except FileExistsError:
            os.unlink(link)
            os.symlink(rel, link)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(rel, link)

    @staticmethod
    def _write(path: Path | str, value: str) -> None:
        """Rewrite an attribute file only when its value changes (sysfs reads are cheap here)."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == value:
                    return
        except FileNotFoundError:
            pass
        # replace, never truncate-then-write: a reader without the lock sees old or new, not ""
        head, name = os.path.split(path)
        tmp = os.path.join(head, f".{name}.new")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(value)
        os.replace(tmp, path)

    def _refresh_attr(self, path: str, value: str) -> None:
        """:meth:`_write` for :meth:`_refresh`, which sets every type's capacity on every parent of a GPU at
        each change (736 files on a 32-VF L40S): with ``remember_attrs``, a file this object last saw holding
        ``value`` and untouched since (the same inode and mtime: a write replaces the file or changes its
        mtime, whoever makes it) is not opened again. Same files, same content as :meth:`_write`."""
        seen = self._seen
        if seen is None:
            return self._write(path, value)
        known = seen.get(path)
        if known is not None and known[0] == value:
            try:
                st = os.stat(path)
                if (st.st_ino, st.st_mtime_ns) == known[1]:
                    return None
            except FileNotFoundError:
                pass
        self._write(path, value)
        st = os.stat(path)
        seen[path] = (value, (st.st_ino, st.st_mtime_ns))
        return None

    def _driver(self, addr: str) -> str | None:
        link = self._fdir(addr) / "driver"
        return os.path.basename(os.readlink(link)) if os.path.lexists(link) else None

    def _group(self, addr: str) -> int:
        return self.state["functions"][addr]["group"]

    def _gpu_of(self, addr: str) -> dict | None:
        pf = self.state["functions"].get(addr, {}).get("physfn", addr)
        return next((g for g in self.state["gpus"] if g["pf"] == pf), None)

    def _gpu_at(self, addr: str) -> dict:
        """The GPU of a function that belongs to one (its PF, a VF, an mdev parent)."""
        gpu = self._gpu_of(addr)
        assert gpu is not None, f"{addr} is no GPU's function"
        return gpu

    def _board(self, gpu: dict) -> BoardSpec:
        return catalog.board(gpu["board"])

    def _vfs(self, gpu: dict) -> list[str]:
        return sorted(a for a, f in self.state["functions"].items() if f.get("physfn") == gpu["pf"])

    def _type_by_id(self, gpu: dict, type_id: str) -> TypeSpec | None:
        return type_index(gpu["board"]).get(type_id)

    def holders(self, paths: set[str]) -> list[int]:
        """Pids holding any of ``paths`` open (the kernel's view of a busy vfio group):
        real processes (tests' children) and the simulated ones."""
        return holding("/proc", paths) + self.procs.holding(paths)

    def _busy(self, group: int, device_dir: Path | None = None) -> bool:
        """Is the group's ``/dev/vfio/<group>``, or a vfio cdev of ``device_dir``, open?

        An iommufd user holds the device's cdev instead of the group; vfio keeps the device
        registered (so its driver cannot let go of it) while either is open.
        """
        paths = {str(self.dev / "vfio" / str(group))}
        if device_dir is not None and (device_dir / "vfio-dev").is_dir():
            paths |= {str(self.dev / "vfio/devices" / n) for n in os.listdir(device_dir / "vfio-dev")}
        return bool(self.holders(paths))

    def _vgpu_busy(self, parent: str, vgpu: str) -> bool:
        """A vGPU (an mdev, or a VF's vendor-VFIO vGPU) held through its group or its cdev."""
        device_dir = self._fdir(parent) if parent == vgpu else self._fdir(parent) / vgpu
        return self._busy(self._vgpu_group(parent, vgpu), device_dir)

    # ------------------------------------------------------------------ capacity
    def _existing(self, gpu: dict) -> list[tuple[str, str, str]]:
        """(parent, vgpu id, type id) of every vGPU on the physical GPU."""
        out = []
        parents = [gpu["pf"], *self._vfs(gpu)]
        for p in parents:
            pdir = os.fspath(self._fdir(p))
            for name in os.listdir(pdir):
                link = os.path.join(pdir, name, "mdev_type")
                if UUID.match(name) and os.path.lexists(link):
                    out.append((p, name, os.path.basename(os.readlink(link))))
            try:
                with open(os.path.join(pdir, "nvidia/current_vgpu_type"), encoding="utf-8") as f:
                    cur = f.read().strip()
            except FileNotFoundError:
                continue
            if cur not in ("", "0"):
                out.append((p, p, cur))
        return out

    def _occupancy(self, gpu: dict, existing: list[tuple[str, str, str]]) -> tuple[Fraction, set]:
        """Share of the GPU its vGPUs take, and their framebuffer sizes."""
        used, sizes = Fraction(0), set()
        for _, _, tid in existing:
            et = self._type_by_id(gpu, tid)
            if et is not None and not et.mig_backed:
                used += Fraction(1, et.max_instances)
                sizes.add(framebuffer(gpu["board"], tid))
        return used, sizes

    def _refresh(self, gpu: dict) -> None:
        """Rewrite ``available_instances`` / ``creatable_vgpu_types`` of every parent of the GPU."""
        facts = type_facts(gpu["board"])
        fw = gpu["framework"]
        existing = self._existing(gpu)
        occupancy = self._occupancy(gpu, existing)
        mixed = slots.mixed(gpu)
        rem = {num: remaining(gpu, t, *occupancy, fb, len(slots.creatable(gpu, existing, num)) if mixed else 0)
               for _, num, t, fb in facts}
        if fw == "mdev":
            types_dir = os.path.join(self._fdir(gpu["pf"]), "mdev_supported_types")
            if os.path.isdir(types_dir):
                for tid, num, _, _ in facts:
                    self._refresh_attr(os.path.join(types_dir, tid, "available_instances"), f"{rem[num]}\n")
            return
        for vf in self._vfs(gpu):
            vdir = self._fdir(vf)
            types_dir = os.path.join(vdir, "mdev_supported_types")
            if fw == "mdev-sriov" and os.path.isdir(types_dir):
                has = any(UUID.match(n) for n in os.listdir(vdir))
                for tid, num, _, _ in facts:
                    self._refresh_attr(os.path.join(types_dir, tid, "available_instances"),
                                f"{0 if has else min(1, rem[num])}\n")
            elif fw == "vendor-vfio" and (vdir / "nvidia").exists():
                current = (vdir / "nvidia/current_vgpu_type").read_text().strip()
                lines = [HEADER]
                if current == "0":
                    lines += [f"{t.num:<6}: {t.name}" for _, num, t, _ in facts if rem[num] > 0]
                self._write(vdir / "nvidia/creatable_vgpu_types", "\n".join(lines) + "\n")

    # ------------------------------------------------------------------ driver model
    def _bind(self, addr: str, driver: str, refresh: bool = True) -> None:
        fdir = self._fdir(addr)
        self._link(fdir / "driver", self.sys / "bus/pci/drivers" / driver)
        self._link(self.sys / "bus/pci/drivers" / driver / addr, fdir)
        gpu = self._gpu_of(addr)
        fn = self.state["functions"][addr]
        self._uevent("bind", "pci", addr, DRIVER=driver)
        if driver == "vfio-pci":
            self._add_cdev(fdir)
        self._update_group_node(fn["group"])  # another driver in the group makes it unusable
        if driver in ("nvidia", "i915") and gpu is not None:
            is_pf = addr == gpu["pf"]
            if gpu["framework"] == "mdev" and is_pf or gpu["framework"] == "mdev-sriov" and not is_pf:
                self._make_mdev_parent(addr, gpu)
            if gpu["framework"] == "vendor-vfio" and not is_pf:
                nv = fdir / "nvidia"
                nv.mkdir(exist_ok=True)
                # placement_id appears once a type is set (NVIDIA/vgpu-device-manager#195)
                for name, val in (("current_vgpu_type", "0"), ("gpu_instance_id", "4294967295"),
                                  ("vgpu_params", ""), ("warm_update", "0")):
                    (nv / name).write_text(val + "\n")
            if refresh:
                self._refresh(gpu)

    def _add_cdev(self, device_dir: Path) -> None:
        """With iommufd, each vfio device also gets ``<dev>/vfio-dev/vfioN`` (its ``device`` link back to
        ``<dev>``, ``/sys/class/vfio-dev/vfioN`` a link to it) and ``/dev/vfio/devices/vfioN``.

        vfio registers the cdev under the device it drives: a PCI function on vfio-pci, an
        mdev, or a VF holding a vendor-VFIO vGPU (kernel.md).
        """
        if not (self.dev / "iommu").exists():
            return
        n = self._bump("next_vfio")
        cdev = device_dir / "vfio-dev" / f"vfio{n}"
        cdev.mkdir(parents=True, exist_ok=True)
        # the cdev's parent device, linked as sysfs links it: via the common ancestor, so it ends in its name
        os.symlink(f"../../../{device_dir.name}", cdev / "device")
        self._link(self.sys / "class/vfio-dev" / cdev.name, cdev)
        (self.dev / f"vfio/devices/vfio{n}").write_text("")

    def _drop_cdevs(self, device_dir: Path) -> None:
        if (device_dir / "vfio-dev").exists():
            for n in os.listdir(device_dir / "vfio-dev"):
                (self.dev / "vfio/devices" / n).unlink(missing_ok=True)
                if os.path.lexists(self.sys / "class/vfio-dev" / n):
                    os.unlink(self.sys / "class/vfio-dev" / n)
            shutil.rmtree(device_dir / "vfio-dev")

    def _update_group_node(self, group: int) -> None:
        """``/dev/vfio/<group>`` exists while every function of the group is on vfio-pci or unbound."""
        members = [a for a, f in self.state["functions"].items() if f["group"] == group]
        drivers = [self._driver(a) for a in members]
        node = self.dev / "vfio" / str(group)
        if members and "vfio-pci" in drivers and all(d in ("vfio-pci", None) for d in drivers):
            node.touch()
        elif node.exists():
            node.unlink()

    def _make_mdev_parent(self, addr: str, gpu: dict) -> None:
        board = self._board(gpu)
        fdir = self._fdir(addr)
        for t in board.types:
            tdir = fdir / "mdev_supported_types" / t.mdev_id(board.driver)
            (tdir / "devices").mkdir(parents=True, exist_ok=True)
            (tdir / "name").write_text(t.name + "\n")
            if t.description is not None:
                (tdir / "description").write_text(t.description if t.description.endswith("\n") else t.description + "\n")
            (tdir / "device_api").write_text("vfio-pci\n")
            (tdir / "available_instances").write_text("0\n")
            (tdir / "create").write_text("")
        self._link(self.sys / "class/mdev_bus" / addr, fdir)

    # ------------------------------------------------------------------ SR-IOV
    def _enable_vfs(self, gpu: dict, n: int) -> None:
        pf = gpu["pf"]
        rel = self.state["functions"][pf]["rel"].rsplit("/", 1)[0]
        board = self._board(gpu)
        slots.clear(gpu)  # sriov-manage -e resets the GPU's vGPU state: mixed-size mode is set after it
        vf_groups = self.state.setdefault("vf_groups", {})
        for i in range(n):
            vf = vf_address(pf, i)
            grp = vf_groups.get(vf) or self._new_group()
            vf_groups[vf] = grp
            (self.sys / f"kernel/iommu_groups/{grp}/devices").mkdir(parents=True, exist_ok=True)
            self._add_function(vf, rel, board.vendor_id, board.device_id, board.class_code,
                               board.subsystem_vendor_id, board.subsystem_device_id, None, grp, board.driver, physfn=pf)
            self.state["functions"][vf]["physfn"] = pf
            numa = (self._fdir(pf) / "numa_node").read_text()
            (self._fdir(vf) / "numa_node").write_text(numa)
            self._link(self._fdir(pf) / f"virtfn{i}", self._fdir(vf))
        self._write(self._fdir(pf) / "sriov_numvfs", f"{n}\n")
        for vf in self._vfs(gpu):
            self._bind(vf, board.driver, refresh=False)  # once for all VFs, below
        self._refresh(gpu)

    # ------------------------------------------------------------------ mdev
    def _vgpu_group(self, parent: str, vgpu: str) -> int:
        if parent == vgpu:
            return self._group(parent)
        return int(os.path.basename(os.readlink(self._fdir(parent) / vgpu / "iommu_group")))

    def _force_remove_mdev(self, parent: str, uid: str) -> None:
        grp = self._vgpu_group(parent, uid)
        mdir = self._fdir(parent) / uid
        type_dir = (mdir / os.readlink(mdir / "mdev_type")).resolve()
        for link in (type_dir / "devices" / uid, self.sys / "bus/mdev/devices" / uid):
            if os.path.lexists(link):
                os.unlink(link)
        shutil.rmtree(self.sys / f"kernel/iommu_groups/{grp}", ignore_errors=True)
        (self.dev / "vfio" / str(grp)).unlink(missing_ok=True)
        self._drop_cdevs(mdir)
        shutil.rmtree(mdir)
        self._uevent("remove", "mdev", parent, uid)
        gpu = self._gpu_of(parent)
        if gpu is not None:
            slots.forget(gpu, uid)
