"""Kernel behaviour of a simulated GPU host: the attribute writes the kernel acts on.

Writes go through :meth:`SimHost.write`, which changes the tree (:mod:`.tree`, the state and
its device model) the way the kernel does and fails with the kernel's errno
(../shared/reference/kernel.md). Processes holding its files open live under ``<root>/proc``
(:mod:`.procs`).

* ``<type>/create``: 36-byte UUID else EINVAL; EEXIST for a UUID anywhere on the host;
  EUSERS when no instance is left.
* ``<mdev>/remove``: ``1`` removes, ``0`` does nothing, EBUSY while a process (real, or
  simulated: :mod:`.procs`) holds the mdev's ``/dev/vfio/<group>`` or, with iommufd, its vfio
  cdev ``/dev/vfio/devices/vfioN`` (the vendor driver's refusal). Unbinding a function, disabling
  VFs and clearing a vendor-VFIO vGPU are refused the same way while its group or cdev is open.
* any write: ENOSPC, before anything changes, when the simulator's own filesystem lacks room to
  model it (a real sysfs is on no disk; see :meth:`SimHost._check_room`).
* ``sriov_numvfs``: ERANGE above total, no-op for the current value, ENOENT without a
  driver, EBUSY for a nonzero value while VFs exist.
* ``driver_override``, ``drivers/<d>/unbind``, ``drivers/<d>/bind``, ``drivers_probe``.
* ``nvidia/current_vgpu_type`` (vendor-specific VFIO): a listed id creates, ``0`` destroys.
* ``nvidia/placement_id`` of an mdev, or of a VF holding a type (mixed-size mode, :mod:`.slots`):
  creation took the lowest creatable placement; writing an id moves the vGPU there when that id
  is creatable beside everything, its own old slots included (the driver reserves the new range,
  then frees the old). Mixed-size mode itself is switched through the simulated NVML.

Writes are ordered as the kernel orders them (:mod:`.locking`): an mdev's create or remove and a VF's
``current_vgpu_type`` under their GPU's lock, so writes to different GPUs proceed at once; every
other write under the node lock.

Points the references mark unconfirmed are settings here: the errno for a type missing from
``creatable_vgpu_types`` (``UNLISTED_TYPE_ERRNO``), writing a new type over a set one (EBUSY),
and the errno of a refused placement write (``PLACEMENT_ERRNO``: in equal-size mode, or an id
that is not creatable). A VF's ``placement_id`` is taken to be writable as an mdev's is, and a
vGPU in use is not moved (EBUSY): the facts are silent on both.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid as uuidlib
from collections.abc import Iterable
from pathlib import Path

from mdev_manager.host.env import HostEnv
from mdev_manager.sim import instances, pcihealth, slots
from mdev_manager.sim.rules import err, kstrtoul, type_facts
from mdev_manager.sim.tree import ADDR, UUID, SysfsTree

UNLISTED_TYPE_ERRNO = errno.EINVAL
PLACEMENT_ERRNO = errno.EINVAL
NO_INSTANCE = 4294967295  # a VF's nvidia/gpu_instance_id before a MIG-backed vGPU takes one


class SimHost(SysfsTree):
    """A simulated host rooted at ``root``: its tree, and the kernel's answer to writes into it."""

    # ------------------------------------------------------------------ unbind (refused while in use)
    def _unbind(self, addr: str) -> None:
        fdir = self._fdir(addr)
        driver = self._driver(addr)
        if driver is None:
            raise err(errno.ENODEV, f"{addr} has no driver")
        gpu = self._gpu_of(addr)
        mine = [e for e in (self._existing(gpu) if gpu else []) if e[0] == addr]
        if any(self._vgpu_busy(p, v) for p, v, _ in mine):
            raise err(errno.EBUSY, f"{addr} has vGPUs in use")
        if gpu and addr == gpu["pf"] and self._vfs(gpu):
            raise err(errno.EBUSY, f"{addr} has VFs enabled; disable them first")
        fn = self.state["functions"][addr]
        if driver == "vfio-pci" and self._busy(fn["group"], fdir):
            raise err(errno.EBUSY, f"/dev/vfio/{fn['group']} or {addr}'s vfio cdev is open")
        for p, v, _ in mine:
            if p != v:
                self._remove_mdev(p, v)
            elif gpu:
                slots.forget(gpu, v)
        if gpu and addr == gpu["pf"] and driver == "nvidia":
            slots.clear(gpu)  # the driver lets go of the GPU: its mixed-size mode is lost
        os.unlink(fdir / "driver")
        os.unlink(self.sys / "bus/pci/drivers" / driver / addr)
        self._uevent("unbind", "pci", addr)
        shutil.rmtree(fdir / "mdev_supported_types", ignore_errors=True)
        shutil.rmtree(fdir / "nvidia", ignore_errors=True)
        if os.path.lexists(self.sys / "class/mdev_bus" / addr):
            os.unlink(self.sys / "class/mdev_bus" / addr)
        self._drop_cdevs(fdir)
        self._update_group_node(fn["group"])
        if gpu and addr != gpu["pf"]:
            self._refresh(gpu)

    # ------------------------------------------------------------------ SR-IOV disable
    def _disable_vfs(self, gpu: dict) -> None:
        vfs = self._vfs(gpu)
        for vf in vfs:
            fn = self.state["functions"][vf]
            if self._busy(fn["group"], self._fdir(vf)) or any(self._vgpu_busy(p, v)
                                                              for p, v, _ in self._existing(gpu) if p == vf):
                raise err(errno.EBUSY, f"VF {vf} is in use")
        for _i, vf in enumerate(vfs):
            if self._driver(vf):
                self._unbind(vf)
            fdir = self._fdir(vf)
            grp = self.state["functions"][vf]["group"]
            os.unlink(self.sys / "bus/pci/devices" / vf)
            os.unlink(self.sys / f"kernel/iommu_groups/{grp}/devices/{vf}")
            (self.dev / "vfio" / str(grp)).unlink(missing_ok=True)
            shutil.rmtree(fdir)
            self._uevent("remove", "pci", vf)
            del self.state["functions"][vf]
        for name in os.listdir(self._fdir(gpu["pf"])):
            if name.startswith("virtfn"):
                os.unlink(self._fdir(gpu["pf"]) / name)
        self._write(self._fdir(gpu["pf"]) / "sriov_numvfs", "0\n")
        slots.clear(gpu)  # sriov-manage -d resets the GPU's vGPU state, mixed-size mode included

    # ------------------------------------------------------------------ mdev create and remove
    def _create_mdev(self, parent: str, type_dir: Path, raw: str) -> None:
        text = raw[:-1] if raw.endswith("\n") else raw
        if len(text) != 36 or not UUID.match(text.lower()):
            raise err(errno.EINVAL, f"{raw!r} is not a UUID")
        uid = str(uuidlib.UUID(text))
        if not self._claim_uuid(uid):
            raise err(errno.EEXIST, f"mdev {uid} exists")
        if int((type_dir / "available_instances").read_text()) < 1:
            raise err(errno.EUSERS, f"no instances of {type_dir.name} left on {parent}")
        gpu = self._gpu_at(parent)
        self._take_instance(gpu, type_dir.name, uid)
        self._first_fit(gpu, type_dir.name, uid)
        mdir = self._fdir(parent) / uid
        mdir.mkdir()
        self._write(mdir / "remove", "")
        if self._board(gpu).driver == "nvidia":
            (mdir / "nvidia").mkdir()
            self._write(mdir / "nvidia/placement_id", slots.read_value(gpu, uid))
        self._write(mdir / "uevent", f"MDEV_TYPE={type_dir.name}\n")
        self._link(mdir / "mdev_type", type_dir)
        grp = self._new_group()
        self._link(mdir / "iommu_group", self.sys / f"kernel/iommu_groups/{grp}")
        self._link(self.sys / f"kernel/iommu_groups/{grp}/devices/{uid}", mdir)
        self._link(mdir / "driver", self.sys / "bus/mdev/drivers/vfio_mdev")
        self._link(self.sys / "bus/mdev/devices" / uid, mdir)
        self._link(type_dir / "devices" / uid, mdir)
        (self.dev / "vfio" / str(grp)).touch()
        self._add_cdev(mdir)
        self._refresh(gpu)
        self._uevent("add", "mdev", parent, uid, MDEV_TYPE=type_dir.name)

    def _remove_mdev(self, parent: str, uid: str) -> None:
        grp = self._vgpu_group(parent, uid)
        if self._vgpu_busy(parent, uid):
            raise err(errno.EBUSY, f"mdev {uid} is in use (/dev/vfio/{grp} or its vfio cdev open)")
        self._force_remove_mdev(parent, uid)
        self._release_instance(self._gpu_of(parent), uid)
        self._refresh(self._gpu_at(parent))

    # ------------------------------------------------------------------ MIG-backed vGPUs
    def _take_instance(self, gpu: dict, type_id: str, vgpu: str, wanted: int | None = None) -> int | None:
        """The GPU instance a new vGPU of ``type_id`` lives on (:func:`.instances.take`); None for
        time-sliced types."""
        t = self._type_by_id(gpu, type_id)
        return None if t is None or not t.mig_backed else instances.take(gpu, t, vgpu, wanted)

    @staticmethod
    def _release_instance(gpu: dict | None, vgpu: str) -> None:
        if gpu:
            instances.release(gpu, vgpu)

    # ------------------------------------------------------------------ placements (mixed-size mode)
    def _first_fit(self, gpu: dict, type_id: str, vgpu: str) -> None:
        """A new time-sliced vGPU of a mixed-size GPU takes the type's lowest creatable placement."""
        if not slots.mixed(gpu) or slots.size_of(gpu["board"], type_id) is None:
            return
        free = slots.creatable(gpu, self._existing(gpu), type_id)
        if not free:  # available_instances / creatable_vgpu_types said so already
            raise err(errno.EUSERS, f"no placement of type {type_id} left")
        slots.place(gpu, vgpu, free[0])

    def _move(self, owner: str, vgpu: str, path: Path, raw: str) -> None:
        """``placement_id`` written: the vGPU moves to a creatable placement of its type."""
        value = kstrtoul(raw)
        gpu = self._gpu_at(owner)
        existing = self._existing(gpu)
        tid = next((t for _, v, t in existing if v == vgpu), None)
        if tid is None:
            raise err(errno.ENODEV, f"{vgpu} holds no vGPU")
        if instances.placement_inside(gpu, vgpu) is not None:  # MIG time-slicing: inside its instance
            if self._vgpu_busy(owner, vgpu):
                raise err(errno.EBUSY, f"vGPU {vgpu} is in use")
            try:
                instances.move(gpu, vgpu, value)
            except ValueError as exc:
                raise err(PLACEMENT_ERRNO, str(exc)) from None
            path.write_text(f"{value}\n")
            self._refresh(gpu)
            return
        if not slots.mixed(gpu) or vgpu not in gpu.get("placements", {}):
            raise err(PLACEMENT_ERRNO, f"{vgpu}: the GPU is in equal-size mode; placements apply in mixed-size mode")
        if self._vgpu_busy(owner, vgpu):
            raise err(errno.EBUSY, f"vGPU {vgpu} is in use")
        if value not in slots.creatable(gpu, existing, tid):
            raise err(PLACEMENT_ERRNO, f"placement {value} of type {tid} is not creatable on the GPU")
        slots.place(gpu, vgpu, value)
        path.write_text(slots.read_value(gpu, vgpu))
        self._refresh(gpu)

    # ------------------------------------------------------------------ vendor VFIO
    def _set_vgpu_type(self, vf: str, raw: str) -> None:
        try:
            value = int(raw.strip())
        except ValueError:
            raise err(errno.EINVAL, f"{raw!r} is not a vGPU type id") from None
        gpu = self._gpu_at(vf)
        nv = self._fdir(vf) / "nvidia"
        current = int((nv / "current_vgpu_type").read_text())
        grp = self._group(vf)
        if value == 0:
            if current and self._busy(grp, self._fdir(vf)):
                raise err(errno.EBUSY, f"vGPU on {vf} is in use")
            self._write(nv / "current_vgpu_type", "0\n")
            (self.dev / "vfio" / str(grp)).unlink(missing_ok=True)
            self._drop_cdevs(self._fdir(vf))
            (nv / "placement_id").unlink(missing_ok=True)
            slots.forget(gpu, vf)
            if current:
                self._release_instance(gpu, vf)
                self._write(nv / "gpu_instance_id", f"{NO_INSTANCE}\n")
        else:
            if current:
                raise err(errno.EBUSY, f"{vf} already holds vGPU type {current}")
            listed = {line.split(":")[0].strip() for line in (nv / "creatable_vgpu_types").read_text().splitlines()[1:]}
            if str(value) not in listed:
                raise err(UNLISTED_TYPE_ERRNO, f"type {value} is not creatable on {vf}")
            chosen = int((nv / "gpu_instance_id").read_text().strip() or NO_INSTANCE)
            gi = self._take_instance(gpu, str(value), vf, None if chosen == NO_INSTANCE else chosen)
            if gi is not None:
                self._write(nv / "gpu_instance_id", f"{gi}\n")
            self._first_fit(gpu, str(value), vf)
            self._write(nv / "current_vgpu_type", f"{value}\n")
            inside = instances.placement_inside(gpu, vf)
            self._write(nv / "placement_id", slots.read_value(gpu, vf) if inside is None else f"{inside}\n")
            (self.dev / "vfio" / str(grp)).touch()
            self._add_cdev(self._fdir(vf))
        self._refresh(gpu)

    # ------------------------------------------------------------------ the write entry point
    def write(self, path: Path, data: str | bytes) -> None:
        """Apply a write to ``path`` (absolute, or relative to ``sys/``) as the kernel would."""
        raw = data.decode() if isinstance(data, bytes) else data
        p = Path(path)
        rel = Path(os.path.relpath(os.path.realpath(p if p.is_absolute() else self.sys / p), self._sys_real))
        if rel.parts[:1] == ("..",):
            raise err(errno.EXDEV, f"{path} is outside the simulated sysfs")
        # mdevctl's udev rule (a host spec's ``mdevctl_udev``) may make vGPUs on any GPU before this write:
        # such a host orders every write node-wide
        udev = self.state["spec"].get("mdevctl_udev")
        pf = None if udev or self._holds_node_lock() else self._gpu_write(rel)
        with self._locked() if pf is None else self._gpu_locked(pf):
            self._check_room(rel, raw)
            if rel.name in ("create", "current_vgpu_type"):
                self._udev_run()
            before = self._parents()
            try:
                self._dispatch(rel, raw)
            finally:
                self._udev_queue(before)
                self._save()

    def _gpu_write(self, rel: Path) -> str | None:
        """The GPU (its PF) a write changes alone, taken under that GPU's lock (:meth:`_gpu_locked`): an
        mdev's ``create`` or ``remove``, a VF's ``current_vgpu_type``; None for a write the whole host
        orders (binding, SR-IOV, ``placement_id``, ...). Read without a lock: a function's GPU never
        changes, and a function gone meanwhile is found so under the lock (ENOENT, as before)."""
        name, parts = rel.name, rel.parts
        if not (name == "create" and len(parts) >= 3 and parts[-3] == "mdev_supported_types"
                or name == "remove" and len(parts) >= 2 and UUID.match(parts[-2])
                or name == "current_vgpu_type" and parts[-2:-1] == ("nvidia",)):
            return None
        functions = self.state["functions"]
        owner = next((x for x in reversed(parts[:-1]) if ADDR.match(x) and x in functions), None)
        gpu = self._gpu_of(owner) if owner is not None else None
        return gpu["pf"] if gpu is not None else None

    # ------------------------------------------------------------------ mdevctl's udev rule
    def _parents(self) -> set[str]:
        return set(os.listdir(self.sys / "class/mdev_bus")) if self.state["spec"].get("mdevctl_udev") else set()

    def _udev_queue(self, before: set[str]) -> None:
        """Queue the ``add`` events of the parents that appeared since ``before`` (udev runs them
        later: :meth:`_udev_run`)."""
        new = sorted(self._parents() - before)
        if new:
            self.state["udev_queue"] = [*self.state.get("udev_queue", []), *new]

    def _udev_run(self) -> None:
        """mdevctl's udev rule (``mdevctl start-parent-mdevs`` at a parent's ``add`` event), with
        ``mdevctl_udev`` in the host's spec: each queued parent still there gets its ``start: auto``
        definitions made (a failure is mdevctl's to log; its start of the others goes on). udev runs
        beside the writer that made the parent appear, and its workers (a driver probe, then one
        mdevctl per parent) are slower than that writer's next look: here they run just before the
        next vGPU is made on the host, after the writer may have looked again and planned (its
        create of a vGPU mdevctl made meanwhile meets EEXIST). A MIG-backed type needs its GPU instance first,
        which mdevctl does not make: not started."""
        queued = self.state.pop("udev_queue", [])
        for parent in dict.fromkeys(queued):
            pdir = self.root / "etc/mdevctl.d" / parent
            gpu = self._gpu_of(parent)
            if gpu is None or not os.path.lexists(self.sys / "class/mdev_bus" / parent) or not pdir.is_dir():
                continue
            for name in sorted(os.listdir(pdir)):
                try:
                    doc = json.loads((pdir / name).read_text())
                    type_id, start = str(doc["mdev_type"]), doc["start"]
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                t = self._type_by_id(gpu, type_id)
                type_dir = self._fdir(parent) / "mdev_supported_types" / type_id
                if start != "auto" or t is None or t.mig_backed or not type_dir.is_dir():
                    continue
                with contextlib.suppress(OSError):
                    self._create_mdev(parent, type_dir, name)

    # ------------------------------------------------------------------ the simulator's own disk
    def room(self) -> tuple[int, int | None]:
        """Bytes and inodes free to the simulator's own files (None: the filesystem counts no inodes)."""
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize, (st.f_favail if st.f_files else None)

    def _check_room(self, rel: Path, raw: str) -> None:
        """Refuse, before changing anything, a write the simulator's own filesystem has no room to model.

        A kernel's sysfs is on no disk, so a real ``create`` never fails half-way for want of space;
        the simulated one is files beside the node's state (``var/lib/vgpuctl``, ``etc/mdevctl.d``),
        so a full disk under it would leave a device directory without its links, or a tree its
        ``state.json`` does not know (then ``create`` answers EEXIST, or EACCES for a VF it does not
        list). The estimate is generous: a block per file; a VF enabled brings its attributes and, per
        type of its board, a directory of a few files (an mdev parent's; a vendor-VFIO VF has fewer)."""
        files = 64
        if rel.name == "sriov_numvfs":
            gpu = self._gpu_of(rel.parts[-2])
            try:
                n = max(0, kstrtoul(raw))
            except OSError:
                n = 0  # the kernel's own EINVAL follows
            if gpu:
                per_type = 8 if gpu["framework"] == "mdev-sriov" else 0
                files += n * (32 + per_type * len(type_facts(gpu["board"])))
        state = self.root / ".sim/state.json"
        need = 2 * (state.stat().st_size if state.exists() else 0) + files * 4096
        free, inodes = self.room()
        if free < need or (inodes is not None and inodes < files):
            raise err(errno.ENOSPC, f"the simulated host's own directory {self.root} has {free} bytes"
                      + (f" and {inodes} inodes" if inodes is not None else "") + f" free, {need} bytes and "
                      f"{files} inodes needed to model this write; nothing was changed (a real sysfs is on no "
                      "disk: free space there and write again)")

    def _dispatch(self, rel: Path, raw: str) -> None:
        full = self.sys / rel
        name = rel.name
        parts = rel.parts
        owner = next((x for x in reversed(parts[:-1]) if ADDR.match(x) and x in self.state["functions"]), None)
        if not os.path.lexists(full):
            raise err(errno.ENOENT, str(rel))
        if owner is not None and self._dispatch_function(owner, full, rel, raw):
            return
        if owner is None and name in ("create", "remove", "sriov_numvfs", "current_vgpu_type", "placement_id") \
                and any(ADDR.match(x) for x in parts[:-1]):
            # an attribute the kernel acts on, of a device the simulator's state does not list: its tree
            # and state disagree (a simulator fault, never a kernel answer; never "read-only": create is
            # write-only)
            raise err(errno.ENODEV, f"{rel}: the simulated host's state lists no such device (its tree and "
                      "state disagree: `vgpuctl sim reset` rebuilds it)")
        if parts[:3] == ("bus", "pci", "drivers") and len(parts) == 5 and name in ("bind", "unbind"):
            addr = raw.strip()
            if addr not in self.state["functions"]:
                raise err(errno.ENODEV, addr)
            if name == "unbind":
                if self._driver(addr) != parts[3]:
                    raise err(errno.ENODEV, f"{addr} is not bound to {parts[3]}")
                return self._unbind(addr)
            return self._bind_explicit(addr, parts[3])
        if parts == ("bus", "pci", "drivers_probe"):
            addr = raw.strip()
            if addr not in self.state["functions"]:
                raise err(errno.ENODEV, addr)
            if self._driver(addr) is None:
                override = (self._fdir(addr) / "driver_override").read_text().strip()
                self._bind(addr, self.state["functions"][addr]["native"] if override == "(null)" else override)
            return
        if parts[-2:-1] == ("nvidia",) and name in ("vgpu_params", "warm_update", "gpu_instance_id"):
            full.write_text(raw if raw.endswith("\n") else raw + "\n")
            return
        if full.is_dir():
            raise err(errno.EISDIR, str(rel))
        raise err(errno.EACCES, f"{rel} is read-only")

    def _dispatch_function(self, owner: str, full: Path, rel: Path, raw: str) -> bool:
        """A write to a file of the PCI function ``owner`` (or of an mdev or type below it); False
        when it is none of those the kernel acts on."""
        name, parts = rel.name, rel.parts
        if name == "create" and len(parts) >= 3 and parts[-3] == "mdev_supported_types":
            self._create_mdev(owner, full.parent, raw)
        elif name == "remove" and UUID.match(parts[-2]):
            if kstrtoul(raw):  # mdev_sysfs.c remove_store: kstrtoul(buf, 0, ...)
                self._remove_mdev(owner, parts[-2])
        elif name == "sriov_numvfs" and owner == parts[-2]:
            self._sriov(owner, raw)
        elif name == "driver_override" and owner == parts[-2]:
            full.write_text((raw.strip() or "(null)") + "\n")
        elif parts[-2:-1] == ("nvidia",) and name == "current_vgpu_type":
            self._set_vgpu_type(owner, raw)
        elif parts[-2:-1] == ("nvidia",) and name == "placement_id":
            self._move(owner, parts[-3] if UUID.match(parts[-3]) else owner, full, raw)
        else:
            return False
        return True

    def _bind_explicit(self, addr: str, driver: str) -> None:
        if self._driver(addr):
            raise err(errno.EBUSY, f"{addr} is bound to {self._driver(addr)}")
        override = (self._fdir(addr) / "driver_override").read_text().strip()
        native = self.state["functions"][addr]["native"]
        if driver != native and override != driver:
            raise err(errno.ENODEV, f"{driver} does not match {addr}")
        self._bind(addr, driver)

    def _sriov(self, pf: str, raw: str) -> None:
        try:
            n = int(raw.strip())
        except ValueError:
            raise err(errno.EINVAL, f"{raw!r}") from None
        gpu = self._gpu_of(pf)
        total = gpu["vf_total"] if gpu else 0
        current = len(self._vfs(gpu)) if gpu else 0
        if n < 0 or n > total:
            raise err(errno.ERANGE, f"{n} VFs requested, {pf} has {total}")
        if n == current:
            return
        assert gpu is not None  # 0 < n <= total: a GPU's PF
        if self._driver(pf) not in ("nvidia", "vfio-pci"):
            raise err(errno.ENOENT, f"{pf}: no driver with SR-IOV support bound")
        if n == 0:
            return self._disable_vfs(gpu)
        if current:
            raise err(errno.EBUSY, f"{pf} has {current} VFs; write 0 first")
        self._enable_vfs(gpu, n)

    # ------------------------------------------------------------------ test and demo hooks
    def gpus(self) -> list[dict]:
        return list(self.state["gpus"])

    def spawn_holder(self, paths: Iterable[Path | str], comm: str = "qemu-kvm", cmdline: list[str] | None = None) -> int:
        """A simulated process holding ``paths`` open (a QEMU on ``/dev/vfio/<group>`` or a
        vfio cdev); returns its pid. Manager and kernel see it as they see a real one."""
        return self.procs.spawn(paths, comm, cmdline)

    def kill(self, pid: int) -> None:
        """End a simulated process; the files it held are free again."""
        self.procs.kill(pid)

    def reboot(self) -> None:
        """A cold boot: no process survives, VFs and every vGPU are gone, drivers back to
        their initial binding, a new boot id."""
        self.procs.kill_all()
        self._new_boot_id()
        with self._locked():
            for gpu in self.state["gpus"]:
                for p, v, _ in self._existing(gpu):
                    if p == v:
                        (self._fdir(p) / "nvidia/current_vgpu_type").write_text("0\n")
                        (self._fdir(p) / "nvidia/placement_id").unlink(missing_ok=True)
                        (self.dev / "vfio" / str(self._group(p))).unlink(missing_ok=True)
                        self._drop_cdevs(self._fdir(p))
                    else:
                        self._force_remove_mdev(p, v)
                if self._vfs(gpu):
                    self._disable_vfs(gpu)
                slots.clear(gpu)  # NVIDIA keeps no mixed-size mode across a boot
                if "mig" in gpu:  # MIG mode is kept on the board; GPU instances are not
                    gpu["mig"]["gis"] = []
            for addr, fn in list(self.state["functions"].items()):
                (self._fdir(addr) / "driver_override").write_text("(null)\n")
                initial = fn.get("initial", fn["native"])
                if self._driver(addr) != (None if initial == "none" else initial):
                    if self._driver(addr):
                        self._unbind(addr)
                    if initial != "none":
                        self._bind(addr, initial)
            for gpu in self.state["gpus"]:
                self._refresh(gpu)
            self.state.pop("udev_queue", None)
            self._udev_queue(set())  # at boot every parent appears
            self._save()

    def _new_boot_id(self) -> None:
        """``/proc/sys/kernel/random/boot_id``: a fresh random UUID at every boot, as the kernel's
        (a host built without one has none until its first reboot)."""
        path = HostEnv.under(self.root).boot_id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{uuidlib.uuid4()}\n")

    def remove_gpu(self, pf: str) -> None:
        """Hot-unplug for good: the GPU leaves the bus (health tests)."""
        self.unplug(pf)
        with self._locked():
            self.state.get("unplugged", {}).pop(pf, None)
            self._save()

    #: what ``health`` can raise on a GPU, as NVML shows it: a critical Xid event, ECC page retirement
    #: pending a reset, the GPU lost (every health call fails NVML_ERROR_GPU_IS_LOST), a GPU that stops
    #: answering (NVML_ERROR_TIMEOUT). Only the health calls see them: the simulator's MIG and placement
    #: calls answer as before (a real lost GPU fails those too).
    #: And as the kernel shows it in sysfs, for a GPU on vfio-pci NVML does not see (:mod:`.pcihealth`):
    #: an AER error counted, the link narrower, config space reading all ones, no reset method left.
    HEALTH = ("xid", "ecc", "lost", "hang", *pcihealth.FAULTS)

    def health(self, pf: str, kind: str, *, xid: int = 79, clear: bool = False) -> None:
        """Raise (or ``clear``) a health fault of ``kind`` on the GPU at ``pf``; an Xid is an event, queued
        until NVML is next asked (clearing drops the queued ones)."""
        if kind not in self.HEALTH:
            raise ValueError(f"health fault {kind!r}: choose one of {', '.join(self.HEALTH)}")
        with self._locked():
            gpu = next((g for g in self.state["gpus"] if g["pf"] == pf.lower()), None)
            if gpu is None:
                raise err(errno.ENODEV, f"no GPU at {pf}")
            if kind in pcihealth.FAULTS:
                return pcihealth.fault(self._fdir(gpu["pf"]), kind, clear=clear)
            h = gpu.setdefault("health", {"xids": [], "ecc": False, "lost": False, "hang": False})
            if kind == "xid":
                h["xids"] = [] if clear else [*h["xids"], int(xid)]
            else:
                h[kind] = not clear
            self._save()

    def upgrade_driver(self, version: str) -> None:
        """The host vGPU manager is replaced by ``version`` (what NVML's driver version answers from now on)."""
        with self._locked():
            self.state["spec"]["driver_version"] = version
            self._save()

    def unplug(self, pf: str) -> None:
        """The GPU leaves the bus (hot-unplug, or fallen off the bus: Xid 79): its functions, VFs,
        vGPUs and IOMMU group vanish from sysfs, as the kernel's PCI removal does; processes holding
        its group keep their now dead file descriptors. :meth:`replug` brings it back, cold."""
        with self._locked():
            gpu = self._gpu_of(pf)
            if gpu is None or gpu["pf"] != pf:
                raise err(errno.ENODEV, f"no GPU at {pf}")
            for p, v, _ in self._existing(gpu):
                if p != v:
                    self._force_remove_mdev(p, v)
            for vf in self._vfs(gpu):
                self._remove_function(vf)
            group = self._group(pf)
            mates = [a for a, fn in self.state["functions"].items() if fn["group"] == group and a != pf]
            kept = {a: {**self.state["functions"][a], "spec": self._identity(a)} for a in [pf, *mates]}
            for addr in [*mates, pf]:
                self._remove_function(addr)
            (self.dev / "vfio" / str(group)).unlink(missing_ok=True)
            self.state["gpus"] = [g for g in self.state["gpus"] if g["pf"] != pf]
            gpu.pop("vfs", None)
            slots.clear(gpu)
            if "mig" in gpu:
                gpu["mig"]["gis"] = []
            self.state.setdefault("unplugged", {})[pf] = {"gpu": gpu, "functions": kept}
            self._save()

    def replug(self, pf: str) -> None:
        """A GPU that left the bus comes back (a rescan, ``echo 1 > /sys/bus/pci/rescan``): cold, as at
        boot, on its initial driver, without VFs or vGPUs."""
        with self._locked():
            before = self._parents()
            gone = self.state.get("unplugged", {}).pop(pf, None)
            if gone is None:
                raise err(errno.ENODEV, f"{pf} did not leave the bus")
            gpu, functions = gone["gpu"], gone["functions"]
            for addr, fn in functions.items():
                rel = fn["rel"].rsplit("/", 1)[0]
                spec = fn["spec"]
                self._add_function(addr, rel, spec["vendor"], spec["device"], spec["class"], spec["svendor"],
                                   spec["sdevice"], spec["numa"], fn["group"], fn["native"])
                self.state["functions"][addr].update({k: v for k, v in fn.items() if k == "initial"})
            self.state["gpus"].append(gpu)
            self.state["gpus"].sort(key=lambda g: g["pf"])
            if gpu.get("vf_total"):
                self._write(self._fdir(pf) / "sriov_totalvfs", f"{gpu['vf_total']}\n")
                self._write(self._fdir(pf) / "sriov_numvfs", "0\n")
            for addr, fn in functions.items():
                initial = fn.get("initial", fn["native"])
                if initial != "none":
                    self._bind(addr, initial, refresh=False)
            self._refresh(gpu)
            self._udev_queue(before)
            self._save()

    def _identity(self, addr: str) -> dict:
        """What a rescan finds again: the function's ids, class and NUMA node."""
        fdir = self._fdir(addr)

        def attr(name: str) -> str:
            return (fdir / name).read_text().strip()

        numa = int(attr("numa_node"))
        return {"vendor": attr("vendor"), "device": attr("device"), "class": attr("class"),
                "svendor": attr("subsystem_vendor"), "sdevice": attr("subsystem_device"),
                "numa": None if numa < 0 else numa}

    def _remove_function(self, addr: str) -> None:
        """One function off the bus: its driver link, its sysfs directory, its IOMMU group entry."""
        drv = self._driver(addr)
        if drv:
            os.unlink(self.sys / "bus/pci/drivers" / drv / addr)
        if os.path.lexists(self.sys / "class/mdev_bus" / addr):
            os.unlink(self.sys / "class/mdev_bus" / addr)
        grp = self._group(addr)
        fdir = self._fdir(addr)
        os.unlink(self.sys / "bus/pci/devices" / addr)
        if os.path.lexists(self.sys / f"kernel/iommu_groups/{grp}/devices/{addr}"):
            os.unlink(self.sys / f"kernel/iommu_groups/{grp}/devices/{addr}")
        self._drop_cdevs(fdir)
        shutil.rmtree(fdir)
        self._uevent("remove", "pci", addr)
        del self.state["functions"][addr]
