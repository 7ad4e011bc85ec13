"""Run a plan's steps against the host: the only module of the manager that writes.

Each step is one or a few attribute writes. A failed write is reported for its device
with the kernel's errno and the steps that depend on it are skipped; the rest of the
plan still runs, and nothing already correct is undone.

Saved state follows the design's crash-safety order: a definition, vendor-VFIO record or
passthrough binding is written before the device changes, and a passthrough binding is
forgotten only once its function is back on its native driver, so a crash between two
writes leaves state that ``restore`` or the next apply completes.
"""

from __future__ import annotations

import errno as errno_mod
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel

from mdev_manager import persist
from mdev_manager.actions import (
    Action,
    BindDriver,
    CreateGpuInstance,
    CreateMdev,
    DestroyGpuInstance,
    DisableVfs,
    EnableVfs,
    Plan,
    RemoveDefinition,
    RemoveMdev,
    SaveDefinition,
    SaveMigRecord,
    SavePassthrough,
    SavePlacementRecord,
    SaveVendorRecord,
    SetMigMode,
    SetMixedSize,
    SetPlacement,
    SetVgpuType,
)
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, link_name, override_value, read_attr
from mdev_manager.host.nvml import Mig, NvmlError, VgpuModes
from mdev_manager.models import MdevDefinition
from mdev_manager.names import check_pci_address, check_type_id, check_uuid

log = logging.getLogger(__name__)


class Stopped(Exception):
    """A stop was asked (a signal) before a write: that write and every one after it are not made."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class _StopBeforeWrites:
    """The transport a run writes through when it can be stopped: every write (kernel attribute,
    saved file, removal, rename) first asks ``stop()``, so a stop lands between two writes of one step
    as well as between two steps (a step may write several files: override, unbind, probe). Every
    state between two writes is one the next apply completes (docs/design.md, "Crash safety by
    ordering"). Everything else goes to the wrapped transport."""

    def __init__(self, io: HostIO, stop: Callable[[], str | None]):
        self._io, self._stop = io, stop
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._io, name)

    def _check(self) -> None:
        why = self._stop()
        if why:
            raise Stopped(why)
        self.writes += 1

    def write(self, path: Path, data: str) -> None:
        self._check()
        self._io.write(path, data)

    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None:
        self._check()
        self._io.write_atomic(path, data, durable)

    def remove(self, path: Path) -> None:
        self._check()
        self._io.remove(path)

    def rename(self, src: Path, dst: Path) -> None:
        self._check()
        self._io.rename(src, dst)

    def rmdir(self, path: Path) -> None:
        self._check()
        self._io.rmdir(path)


class StepResult(BaseModel):
    step: str
    device: str
    ok: bool
    skipped: bool = False
    error: str | None = None  # errno name, e.g. EBUSY
    message: str | None = None


class Report(BaseModel):
    results: list[StepResult] = []
    stopped: str | None = None  # why the run stopped before a write (a signal), None if it ran through
    left: int = 0  # steps not finished because it stopped (``interrupted`` among them)
    interrupted: str | None = None  # the step a stop landed in, between two of its writes

    @property
    def failed(self) -> list[StepResult]:
        return [r for r in self.results if not r.ok]

    @property
    def changed(self) -> int:
        return sum(1 for r in self.results if r.ok and not r.skipped)


def _device(a: Action) -> str:
    for field in ("uuid", "vf", "address", "vgpu"):
        if hasattr(a, field):
            return getattr(a, field)
    return a.gpu


def _blocks(a: Action) -> set[str]:
    """Keys that, when this step fails, make later steps meaningless."""
    if isinstance(a, (EnableVfs, DisableVfs, BindDriver, SetMigMode, CreateGpuInstance, DestroyGpuInstance,
                      SetMixedSize, SavePlacementRecord)):
        return {f"gpu:{a.gpu}"}  # no placement record, no device it would place
    if isinstance(a, (SaveDefinition, CreateMdev)):
        return {f"mdev:{a.uuid}"}
    if isinstance(a, RemoveMdev):
        return {f"mdev:{a.uuid}"}
    if isinstance(a, (SetVgpuType, SaveVendorRecord)):
        return {f"vf:{a.vf}"}
    return set()


def _needs(a: Action) -> set[str]:
    keys = {f"gpu:{a.gpu}"}
    if isinstance(a, (CreateMdev, RemoveDefinition)):
        keys.add(f"mdev:{a.uuid}")
    if isinstance(a, (SetVgpuType, SaveVendorRecord)):
        keys.add(f"vf:{a.vf}")
    if isinstance(a, SetPlacement):
        keys.add(f"vf:{a.vgpu}" if a.vgpu == a.parent else f"mdev:{a.vgpu}")
    return keys


class Executor:
    """Runs a plan's steps in order. ``stop()`` is asked before every write, so a stop waits for no
    more than the write in flight, whatever the step (every state between two writes is one the next
    apply completes, as after a crash)."""

    def __init__(self, env: HostEnv, io: HostIO, on_step: Callable[[object], None] | None = None,
                 stop: Callable[[], str | None] | None = None):
        self.env = env
        self.io = io
        self.on_step = on_step
        self.stop = stop
        self._records: dict[str, str] | None = None
        self._unsynced = False
        self._layout_made = False  # mdevctl's scripts.d made once per run, not once per definition
        self._dirs: dict[str, Path] | None = None

    def _dev(self, address: str) -> Path:
        """The device's real directory, resolved once per run (a device does not move within one)."""
        if self._dirs is None:  # called outside run() (the DRA plugin): no cache to go stale
            return self.io.realpath(self.env.pci(check_pci_address(address)))
        d = self._dirs.get(address)
        if d is None:
            d = self._dirs[address] = self.io.realpath(self.env.pci(check_pci_address(address)))
        return d

    def run(self, plan: Plan) -> Report:
        self._dirs, self._layout_made = {}, False
        io = self.io
        if self.stop is not None:
            self.io = cast(HostIO, _StopBeforeWrites(io, self.stop))
        try:
            with self.io.reusing_dirs():  # 16 creates into one type directory: walk its path once
                return self._run(plan)
        finally:
            self._dirs = None
            self.io = io

    def _run(self, plan: Plan) -> Report:
        report = Report()
        broken: dict[str, str] = {}  # key -> the failed step that made it meaningless
        for i, a in enumerate(plan.actions):
            why = self.stop() if self.stop else None
            if why:
                report.stopped, report.left = why, len(plan.actions) - i
                break
            cause = next((broken[k] for k in sorted(_needs(a)) if k in broken), None)
            if cause is not None:  # said once, as skipped, naming the failure it follows (reported on its own)
                report.results.append(StepResult(step=a.describe(), device=_device(a), ok=False, skipped=True,
                                                 message=f"not run: {cause} failed first"))
                broken.update(dict.fromkeys(_blocks(a), cause))
                continue
            before = getattr(self.io, "writes", 0)
            try:
                self.apply(a)
            except Stopped as exc:
                report.stopped, report.left = exc.why, len(plan.actions) - i
                if getattr(self.io, "writes", 0) > before:  # some of its writes made: a rerun finishes it
                    report.interrupted = a.describe()
                break
            except NvmlError as exc:
                log.debug("%s failed: %s", a.describe(), exc)  # the report names it; callers print or log it once
                report.results.append(StepResult(step=a.describe(), device=_device(a), ok=False,
                                                 error=f"NVML_ERROR_{exc.code}", message=str(exc)))
                broken.update(dict.fromkeys(_blocks(a), a.describe()))
                continue
            except OSError as exc:
                name = errno_mod.errorcode.get(exc.errno or 0, "EIO")
                log.debug("%s failed: %s", a.describe(), exc)
                text = exc.strerror or str(exc)
                if exc.filename and str(exc.filename) not in text:  # the file the disk refused: named
                    text += f": {exc.filename}"
                report.results.append(StepResult(step=a.describe(), device=_device(a), ok=False, error=name,
                                                 message=text))
                broken.update(dict.fromkeys(_blocks(a), a.describe()))
                continue
            report.results.append(StepResult(step=a.describe(), device=_device(a), ok=True))
            if self.on_step:
                self.on_step(a)
        if self._unsynced:  # what was written is made durable, stopped or not
            self.io.sync()
            self._unsynced = False
        return report

    # ------------------------------------------------------------ one step
    def apply(self, a: Action) -> None:
        env, io = self.env, self.io
        if isinstance(a, EnableVfs):
            io.write(env.pci(check_pci_address(a.gpu)) / "sriov_numvfs", f"{a.count}\n")
        elif isinstance(a, DisableVfs):
            io.write(env.pci(check_pci_address(a.gpu)) / "sriov_numvfs", "0\n")
        elif isinstance(a, BindDriver):
            addr = check_pci_address(a.address)
            if a.driver == "vfio-pci":
                self._passthrough(addr, check_pci_address(a.gpu))  # before the bind: restore can finish it
            self.bind(addr, a.driver)
            if a.driver is None:
                self._passthrough(addr, None)
        elif isinstance(a, SaveDefinition):
            # Ordering (definition before device) is what crash safety needs; durability against
            # power loss comes from one sync at the end of the run (a reboot loses the devices too).
            persist.save_definition(env, io, MdevDefinition(uuid=a.uuid, parent=a.parent, mdev_type=a.type_id,
                                                            start=a.start), durable=False, layout_made=self._layout_made)
            self._unsynced = self._layout_made = True
        elif isinstance(a, CreateMdev):
            self.create_mdev(a.parent, a.type_id, a.uuid)
        elif isinstance(a, RemoveMdev):
            self.remove_mdev(a.parent, a.uuid)
        elif isinstance(a, RemoveDefinition):
            persist.remove_definition(env, io, a.parent, a.uuid)
        elif isinstance(a, SetVgpuType):
            self.set_vgpu_type(a.vf, a.type_id, a.gpu_instance)
        elif isinstance(a, SetMigMode):
            Mig(io.nvml()).set_mode(check_pci_address(a.gpu), a.enabled)
        elif isinstance(a, CreateGpuInstance):
            Mig(io.nvml()).create(check_pci_address(a.gpu), a.profile_id, a.start, a.size)
        elif isinstance(a, DestroyGpuInstance):
            Mig(io.nvml()).destroy(check_pci_address(a.gpu), a.gpu_instance)
        elif isinstance(a, SetMixedSize):
            VgpuModes(io.nvml()).set_mode(check_pci_address(a.gpu), a.enabled)
        elif isinstance(a, SetPlacement):
            self.set_placement(a.parent, a.vgpu, a.placement)
        elif isinstance(a, SavePlacementRecord):
            saved = persist.load_placements(env, io)
            saved[check_pci_address(a.gpu)] = {"mixed": a.mixed, "vgpus": a.vgpus}
            persist.save_placements(env, io, saved)
        elif isinstance(a, SaveMigRecord):
            saved_mig = persist.load_mig(env, io)
            saved_mig[check_pci_address(a.gpu)] = a.instances
            persist.save_mig(env, io, saved_mig)
        elif isinstance(a, SavePassthrough):
            self._passthrough(check_pci_address(a.address), check_pci_address(a.gpu) if a.keep else None)
        elif isinstance(a, SaveVendorRecord):
            records = dict(self.records())
            if a.type_id is None:
                records.pop(a.vf, None)
            else:
                records[a.vf] = a.type_id
            persist.save_vendor_vfio(env, io, records)
            self._records = records
        else:  # pragma: no cover
            raise TypeError(f"unknown step {a!r}")

    def _passthrough(self, function: str, gpu: str | None) -> None:
        """Remember (``gpu`` set) or forget a function a layout passes through; no write when unchanged.

        Only plan steps come here: the kubelet plugin's passthrough claims (``bind`` called
        directly) are the plugin's to recover from its checkpoint.
        """
        saved = persist.load_passthrough(self.env, self.io)
        if saved.get(function) == gpu:
            return
        if gpu is None:
            del saved[function]
        else:
            saved[function] = gpu
        # synced once at the end of the run, as definitions are (a reboot loses the binding too)
        persist.save_passthrough(self.env, self.io, saved, durable=False)
        self._unsynced = True

    def records(self) -> dict[str, str]:
        if self._records is None:
            self._records = persist.load_vendor_vfio(self.env, self.io)
        return self._records

    # ------------------------------------------------------------ kernel operations (also used by the DRA bridge)
    def create_mdev(self, parent: str, type_id: str, uuid: str) -> None:
        """Write ``uuid`` to the type's ``create``. EEXIST (the kernel's answer for a UUID that exists
        anywhere on the host) for the very vGPU asked for, on this parent and of this type (made by an
        earlier apply whose report was lost, or by mdevctl's own start at a parent's appearance), is
        adopted: the step is done. Any other holder of the UUID fails the step, named."""
        path = self._dev(parent) / "mdev_supported_types" / check_type_id(type_id) / "create"
        try:
            self.io.write(path, check_uuid(uuid) + "\n")
        except OSError as exc:
            if exc.errno != errno_mod.EEXIST:
                raise
            where = self._mdev_now(uuid)
            if where == (parent, type_id):
                log.info("mdev %s of type %s on %s exists already: adopted", uuid, type_id, parent)
                return
            held = (f"as type {where[1] or 'unknown'} on {where[0]}" if where
                    else "but not as a vGPU this host lists (/sys/bus/mdev/devices has no such device)")
            raise OSError(errno_mod.EEXIST, f"a device {uuid} exists {held}", str(path)) from None

    def _mdev_now(self, uuid: str) -> tuple[str, str | None] | None:
        """(parent, type id) of the mdev ``uuid`` as sysfs lists it now, None if it lists none."""
        link = self.env.mdev_devices / uuid
        if not self.io.exists(link):
            return None
        real = self.io.realpath(link)
        return real.parent.name, link_name(self.io, real / "mdev_type")

    def remove_mdev(self, parent: str, uuid: str) -> None:
        path = self.env.pci(check_pci_address(parent)) / check_uuid(uuid) / "remove"
        if not self.io.exists(path):
            return  # already gone: removal is idempotent
        self.io.write(path, "1\n")

    def set_vgpu_type(self, vf: str, type_id: str, gpu_instance: int | None = None) -> None:
        """``gpu_instance``: a MIG-backed type's GPU instance, named in the VF's ``gpu_instance_id``
        before the type is set (NVIDIA's vendor-specific VFIO)."""
        if type_id != "0":
            check_type_id(type_id)
        if not type_id.isdigit():
            raise OSError(errno_mod.EINVAL, f"vendor-VFIO type ids are decimal, not {type_id!r}")
        nv = self.env.pci(check_pci_address(vf)) / "nvidia"
        if gpu_instance is not None and type_id != "0":
            self.io.write(nv / "gpu_instance_id", f"{int(gpu_instance)}\n")
        self.io.write(nv / "current_vgpu_type", f"{type_id}\n")

    def set_placement(self, parent: str, vgpu: str, placement: int) -> None:
        """Move a vGPU (mixed-size mode) to ``placement`` through its ``nvidia/placement_id``, then read
        it back: a value other than the one written fails the step (EIO), whatever the write said."""
        base = self.env.pci(check_pci_address(parent))
        path = (base if vgpu == parent else base / check_uuid(vgpu)) / "nvidia" / "placement_id"
        if (read_attr(self.io, path) or "").strip() != str(int(placement)):
            self.io.write(path, f"{int(placement)}\n")
        got = (read_attr(self.io, path) or "").strip()
        if got != str(int(placement)):
            raise OSError(errno_mod.EIO, f"{path} reads {got or 'nothing'} after writing {placement}")

    def bind(self, address: str, driver: str | None) -> None:
        """driver_override, unbind, drivers_probe (kernel.md); ``None`` returns to the native driver."""
        env, io = self.env, self.io
        current = link_name(io, env.pci(address) / "driver")
        if driver is not None and current == driver:
            return
        if driver is None and current not in (None, "vfio-pci"):
            if override_value(read_attr(io, env.pci(address) / "driver_override")):
                io.write(env.pci(address) / "driver_override", "\n")  # native already: only the override goes
            return
        io.write(env.pci(address) / "driver_override", f"{driver or ''}\n")
        if current:
            io.write(env.pci_drivers / current / "unbind", address)
        io.write(env.drivers_probe, address)


def execute(plan: Plan, env: HostEnv, io: HostIO, on_step: Callable[[object], None] | None = None) -> Report:
    return Executor(env, io, on_step).run(plan)
