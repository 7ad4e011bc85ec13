"""Each GPU's state, kept in memory between resyncs, read again only where something changed (#37).

Reading the whole node (every GPU's functions, VFs, types, vGPUs, GPU instances) costs about a
second of Python on a 16-GPU node with 512 VFs, so a resync must not do it because one claim was
prepared. :class:`GpuStates` keeps the inventory of the last read and, at each resync:

* reads again the GPUs a prepare or unprepare touched (:meth:`GpuStates.touched`, called by the
  kubelet plugin after its effects, under that GPU's lock);
* reads the cheap per-GPU fingerprints (:func:`~mdev_manager.host.fingerprint.host_marks`: the PCI
  functions present, their drivers, the mdevs, the vendor-VFIO types, ``sriov_numvfs``) and reads
  again each GPU whose fingerprint changed (a hand-made ``mdevctl start``, a rebind);
* reads the whole node only at the first read, after a layout apply changed the node
  (:meth:`GpuStates.invalidate`), or when a function no known GPU owns came or went (a new GPU,
  a GPU's new VFs seen before the GPU was read again; where the GPU was touched, e.g. by a uevent
  naming its VFs, it is read first, and the node only if functions are still unaccounted for);
* on the periodic safety-net check (``check=True``), also reads again each GPU in MIG mode: its
  GPU instances live in the driver (NVML), not in sysfs, so no fingerprint shows them.

The marks are read before the GPUs, so a change made while a GPU is read shows in the next
comparison; a GPU marked touched while it is read stays marked for the next resync. Their digest
(:attr:`GpuStates.host_print`) is what the agent compares to skip a resync: one listing of the host
per resync, not a second one after it (#37).
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Iterable

from mdev_manager.discovery import discover, read_function, read_gpu
from mdev_manager.gpurefresh import refresh_vgpus
from mdev_manager.host.env import HostEnv
from mdev_manager.host.fingerprint import gpu_prints, host_marks
from mdev_manager.host.io import HostIO
from mdev_manager.models import Gpu, Inventory


def owners(inv: Inventory) -> dict[str, str]:
    """Each PCI function a GPU accounts for (itself, its VFs, its IOMMU group's members) -> the GPU."""
    out: dict[str, str] = {}
    for g in inv.gpus:
        out[g.address] = g.address
        for vf in g.vfs:
            out[vf.address] = g.address
        for m in g.iommu_group_members:
            out.setdefault(m, g.address)
    return out


class GpuStates:
    """The node's inventory, kept and read again per GPU (see the module's docstring)."""

    def __init__(self, env: HostEnv, io: HostIO, node: str):
        self.env, self.io, self.node = env, io, node
        self.inventory: Inventory | None = None
        self.reads: Counter[str] = Counter()  # "whole", "gpu" and "vgpus" reads made (tests, the benchmark)
        self._lock = threading.Lock()
        self._touched: set[str] = set()
        self._whole = True
        self._prints: dict[str, str] = {}
        self._fixed: dict[str, str] = {}  # each GPU's print without its mdevs: functions, drivers, VFs
        self._rest: str | None = None
        self._mdev_parent: dict[str, str] = {}
        self._owners: tuple[Inventory | None, dict[str, str]] = (None, {})
        self.host_print: str | None = None  # digest of the host's marks the last read started from

    def read_host_print(self) -> str:
        """The digest of the host's marks now (what :attr:`host_print` was at the last read, if nothing
        changed since): the same reads as :func:`~mdev_manager.host.fingerprint.fingerprint`."""
        return marks_digest(host_marks(self.env, self.io, self._mdev_parent))

    def owners(self) -> dict[str, str]:
        """Each PCI function the GPUs as last read account for -> its GPU (kept until the next read:
        a storm of uevents maps each through it)."""
        inv = self.inventory
        if self._owners[0] is not inv:
            self._owners = (inv, owners(inv) if inv is not None else {})
        return self._owners[1]

    def pending(self) -> bool:
        """Whether the next :meth:`current` has something to read whatever the host's marks say: GPUs
        touched, or the whole node."""
        with self._lock:
            return self._whole or bool(self._touched)

    def touched(self, gpus: Iterable[str]) -> None:
        """A prepare's or unprepare's effects changed these GPUs: read them again at the next resync."""
        with self._lock:
            self._touched.update(gpus)

    def gpu(self, address: str) -> Gpu | None:
        """A GPU as last read (None: not read, or the whole node is to be read again). A prepare plans
        on it instead of reading the GPU, and asks the host before it uses what it shows
        (:func:`dra_bridge.kubeletplugin.effects.choose_parent`)."""
        inv = self.inventory
        if inv is None or self._whole:
            return None
        return inv.gpu(address)

    def invalidate(self) -> None:
        """Read the whole node at the next resync (a layout apply changed it)."""
        with self._lock:
            self._whole = True

    def current(self, check: bool = False) -> Inventory:
        """The inventory now, reading only what changed; ``check``: the periodic safety net (GPUs in
        MIG mode are read again too). A failed read leaves what it would have read for the next call."""
        with self._lock:
            touched, self._touched = self._touched, set()
            whole, self._whole = self._whole, False
        try:
            return self._read(touched, whole, check)
        except BaseException:
            with self._lock:
                self._touched |= touched
                self._whole = self._whole or whole or self.inventory is None
            raise

    def _read(self, touched: set[str], whole: bool, check: bool) -> Inventory:
        marks = host_marks(self.env, self.io, self._mdev_parent)
        self.host_print = marks_digest(marks)
        inv = self.inventory
        present = {m[0] for m in marks if m[1] == "present"}
        if not whole and inv is not None and all(g.address in present for g in inv.gpus):
            prints, rest = gpu_prints(marks, owners(inv))
            # functions no GPU accounted for may be a touched GPU's (VFs a uevent named): read it, then judge
            settled = rest == self._rest  # else a touched GPU's functions changed: read it whole
            if (settled or touched) and set(prints) == {g.address for g in inv.gpus}:
                again = (touched & set(prints)) | {a for a, p in prints.items() if p != self._prints.get(a)}
                if check:
                    again |= {g.address for g in inv.gpus if g.mig is not None and g.mig.enabled}
                fixed = fixed_prints(marks, owners(inv))
                mig = {g.address for g in inv.gpus if g.mig is not None and g.mig.enabled} if check else set()
                gpus = [self._read_gpu(g, light=settled and fixed.get(g.address) == self._fixed.get(g.address)
                                       and g.address not in mig) if g.address in again else g for g in inv.gpus]
                new = inv.model_copy(update={"gpus": gpus})
                prints, rest = gpu_prints(marks, owners(new))  # a GPU read again may own other functions now
                if rest == self._rest:
                    self.inventory, self._prints, self._fixed = new, prints, fixed_prints(marks, owners(new))
                    return new
        inv = discover(self.env, self.io, node=self.node)
        self.reads["whole"] += 1
        self._prints, self._rest = gpu_prints(marks, owners(inv))
        self._fixed = fixed_prints(marks, owners(inv))
        self.inventory = inv
        return inv

    def _read_gpu(self, gpu: Gpu, light: bool) -> Gpu:
        """The GPU read again: ``light`` (its functions and drivers unchanged, a vGPU made or removed), only
        its vGPUs, types' free instances and NVML's view (:func:`~mdev_manager.gpurefresh.refresh_vgpus`)."""
        if light:
            fresh = refresh_vgpus(self.env, self.io, gpu)
            if fresh is not None:
                self.reads["vgpus"] += 1
                return fresh
        self.reads["gpu"] += 1
        return read_gpu(self.env, self.io, gpu.address, gpu.index, read_function(self.env, self.io, gpu.address))


def marks_digest(marks: list[tuple[str, ...]]) -> str:
    return hashlib.sha256(repr(marks).encode()).hexdigest()


def fixed_prints(marks: list[tuple[str, ...]], owner: dict[str, str]) -> dict[str, str]:
    """Each GPU's print of the marks a vGPU's creation or removal leaves alone (all but the mdevs)."""
    return gpu_prints([m for m in marks if len(m) < 2 or m[1] != "mdev"], owner)[0]
