"""The kubelet plugin's driver: NodePrepareResources / NodeUnprepareResources.

Wiring only: claims come from a ClaimSource (:mod:`.claimsource`), devices from the
published pool, effects from :mod:`.effects`, files from :mod:`.cdi` and :mod:`.metadata`,
and every change is checkpointed before prepare answers. Prepare is idempotent: a prepared
claim answers from the checkpoint and creates nothing new.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from pathlib import Path

from mdev_manager.host.env import HostEnv
from mdev_manager.executor import Executor
from mdev_manager.host.io import HostIO, RealIO, link_name
from mdev_manager.models import Usage

from dra_bridge.kubeletplugin import cdi

from dra_bridge.kubeletplugin import metadata
from dra_bridge.kubeletplugin.checkpoint import Checkpoint, CheckpointStore, ClaimRecord, PreparedDeviceRecord
from dra_bridge.kubeletplugin.claimsource import ClaimSource, allocation_results
from dra_bridge.pool.devices import Pool
from dra_bridge.kubelet.dra_grpc import ClaimRef, DeviceHealthRecord, PreparedDevice, PrepareResult
from dra_bridge.kubeletplugin.paths import PluginPaths
from dra_bridge.kubeletplugin.effects import (PrepareError, bind_passthrough, create_vgpu, passthrough_moves, plan_vgpu, read_one_gpu,
                    release_passthrough, remove_vgpu)

log = logging.getLogger(__name__)


class Driver:
    def __init__(self, *, env: HostEnv, paths: PluginPaths, pool_name: str, claims: ClaimSource,
                 pool: Callable[[], Pool], io: HostIO | None = None):
        self.env = env
        self.io = io or RealIO()
        self.paths = paths
        self.pool_name = pool_name
        self.claims = claims
        self.pool = pool
        self.ex = Executor(env, self.io)
        self.store = CheckpointStore(paths.checkpoint, self.io)
        self._lock = threading.Lock()
        self.cp: Checkpoint = self.store.load()

    # ------------------------------------------------------------ start-up
    def recover(self) -> list[str]:
        """Undo claims a crash left half-prepared; the kubelet prepares them again."""
        undone = []
        with self._lock:
            for uid, rec in list(self.cp.claims.items()):
                if rec.state == "preparing":
                    self._undo(rec)
                    del self.cp.claims[uid]
                    undone.append(uid)
            if undone:
                self.store.save(self.cp)
        return undone

    # ------------------------------------------------------------ prepare
    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        out = {}
        with self._lock:
            for ref in claims:
                try:
                    out[ref.uid] = PrepareResult(devices=self._prepare_one(ref))
                except PrepareError as exc:
                    out[ref.uid] = PrepareResult(error=str(exc))
                except OSError as exc:
                    out[ref.uid] = PrepareResult(error=f"claim {ref.namespace}/{ref.name}: {exc}")
        return out

    def _answer(self, rec: ClaimRecord) -> list[PreparedDevice]:
        return [PreparedDevice(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                               cdi_device_ids=d.cdi_ids) for d in rec.devices]

    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        known = self.cp.claims.get(ref.uid)
        if known and known.state == "prepared":
            return self._answer(known)
        if known:  # a previous attempt failed or crashed half-way: start clean
            self._undo(known)
            del self.cp.claims[ref.uid]
            self.store.save(self.cp)
        try:
            claim = self.claims.get(ref.namespace, ref.name)
        except Exception as exc:  # API errors become the claim's error
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: cannot read it from the API server: {exc}") from None
        if claim["metadata"].get("uid") != ref.uid:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} has uid {claim['metadata'].get('uid')}, "
                               f"the kubelet asked for {ref.uid}")
        results = [r for r in allocation_results(claim) if r.get("driver") == self.paths.driver]
        if not results:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} has no devices allocated from {self.paths.driver}")
        records, gpus = self._plan(ref, results)
        rec = ClaimRecord(uid=ref.uid, namespace=ref.namespace, name=ref.name, devices=records)
        self.cp.claims[ref.uid] = rec
        self.store.save(self.cp)  # intent first: a crash from here on is undone by recover()
        try:
            self._apply(rec, claim, gpus)
        except (OSError, PrepareError) as exc:
            self._undo(rec)
            del self.cp.claims[ref.uid]
            self.store.save(self.cp)
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: {exc}") from None
        rec.state = "prepared"
        self.store.save(self.cp)
        return self._answer(rec)

    def _plan(self, ref: ClaimRef, results: list[dict]) -> tuple[list[PreparedDeviceRecord], dict]:
        pool = self.pool()
        taken: set[str] = set()
        records = []
        gpus = {}
        for r in results:
            where = f"claim {ref.namespace}/{ref.name} request {r.get('request')}"
            if r.get("pool") != self.pool_name:
                raise PrepareError(f"{where}: device {r.get('device')} is in pool {r.get('pool')}, "
                                   f"this node's pool is {self.pool_name}")
            dev = pool.device(r.get("device", ""))
            if dev is None:
                raise PrepareError(f"{where}: device {r.get('device')} no longer exists on this node")
            gpu = gpus.get(dev.gpu) or read_one_gpu(self.env, self.io, dev.gpu)
            if gpu is None:
                raise PrepareError(f"{where}: GPU {dev.gpu} of device {dev.name} is gone")
            gpus[dev.gpu] = gpu
            rec = PreparedDeviceRecord(request=r["request"], pool=r["pool"], device=dev.name, kind=dev.kind,
                                       gpu=dev.gpu, type_id=dev.type_id)
            if dev.kind == "vgpu":
                try:
                    rec = plan_vgpu(gpu, rec, taken)
                except PrepareError as exc:
                    raise PrepareError(f"{where}: {exc}") from None
            records.append(rec)
        return records, gpus

    def _apply(self, rec: ClaimRecord, claim: dict, gpus: dict) -> None:
        """Make the devices (on the GPUs ``_plan`` read), then the CDI specs and metadata."""
        cdi_devices: dict[str, list[dict]] = {}
        by_request: dict[str, list[dict]] = {}
        for d in rec.devices:
            gpu = gpus[d.gpu]
            if d.kind == "vgpu":
                create_vgpu(self.ex, gpu, d)
                link = (self.env.mdev_devices / d.vgpu_id if d.framework == "mdev" else self.env.pci(d.parent))
                group = link_name(self.io, link / "iommu_group")
                d.iommu_group = int(group) if group and group.isdigit() else None
                cdevs = self.io.listdir(link / "vfio-dev")  # with iommufd: the vGPU's own vfio cdev
                vfio_dev = cdevs[0] if cdevs else None
                attrs = {"mdevUUID": {"string": d.vgpu_id}} if d.framework == "mdev" else \
                    {"resource.kubernetes.io/pciBusID": {"string": d.vgpu_id}}
            else:
                d.rebound = passthrough_moves(gpu)
                d.vfs_disabled = gpu.sriov_num_vfs
                self.store.save(self.cp)  # what to give back, on disk before the first bind (crash safety)
                bind_passthrough(self.ex, gpu)
                after = read_one_gpu(self.env, self.io, d.gpu)
                d.iommu_group, vfio_dev = after.iommu_group, after.vfio_dev
                attrs = {"resource.kubernetes.io/pciBusID": {"string": d.gpu}}
            cdi_devices[d.device] = cdi.vfio_nodes(self.env, d.iommu_group, vfio_dev, self.io.exists(self.env.iommufd))
            d.cdi_ids = [cdi.cdi_id(self.paths.driver, rec.uid, d.device)]
            by_request.setdefault(d.request, []).append(
                {"driver": self.paths.driver, "pool": d.pool, "name": d.device, "attributes": attrs})
        spec_file = cdi.spec_path(self.paths.cdi_root, self.paths.driver, rec.uid)
        cdi.write_spec(self.io, spec_file, cdi.claim_spec(self.paths.driver, rec.uid, cdi_devices))
        rec.cdi_files.append(str(spec_file))
        for request, devices in by_request.items():
            host = metadata.host_file(self.paths.metadata_dir, rec.namespace, rec.name, request)
            metadata.write(self.io, host, metadata.document(claim, request, devices))
            rec.metadata_files.append(str(host))
            spec, mid = metadata.cdi_spec(self.paths.driver, rec.uid, request, host,
                                          metadata.container_path(self.paths.driver, claim, request))
            mpath = metadata.cdi_path(self.paths.cdi_root, self.paths.driver, rec.uid, request)
            cdi.write_spec(self.io, mpath, spec)
            rec.cdi_files.append(str(mpath))
            for d in rec.devices:
                if d.request == request:
                    d.cdi_ids.append(mid)

    # ------------------------------------------------------------ unprepare
    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        with self._lock:
            for ref in claims:
                rec = self.cp.claims.get(ref.uid)
                if rec is None:
                    out[ref.uid] = None  # unknown claims are a no-op
                    continue
                try:
                    self._undo(rec)
                except OSError as exc:
                    out[ref.uid] = f"claim {ref.namespace}/{ref.name}: {exc}"
                    continue
                del self.cp.claims[ref.uid]
                self.store.save(self.cp)
                out[ref.uid] = None
        return out

    def _undo(self, rec: ClaimRecord) -> None:
        """Remove what prepare made; tolerant of parts that were never made."""
        for d in rec.devices:
            if d.kind == "vgpu" and d.parent:
                remove_vgpu(self.ex, self.env, self.io, d)
            elif d.kind == "passthrough" and (d.rebound or d.vfs_disabled):
                release_passthrough(self.ex, read_one_gpu(self.env, self.io, d.gpu), d)
        cdi_files, metadata_files = self._files(rec)
        for f in cdi_files + metadata_files:
            self.io.remove(f)
        for f in metadata_files:  # remove the per-claim directories the metadata lived in
            for parent in (Path(f).parent, Path(f).parent.parent):
                try:
                    parent.rmdir()
                except OSError:
                    pass

    def _files(self, rec: ClaimRecord) -> tuple[list[str], list[str]]:
        """The claim's CDI and metadata files: recorded ones plus the deterministic paths prepare
        writes (a crash after writing them but before the final checkpoint left them unrecorded)."""
        cdi_files = list(rec.cdi_files) + [str(cdi.spec_path(self.paths.cdi_root, self.paths.driver, rec.uid))]
        metadata_files = list(rec.metadata_files)
        for request in sorted({d.request for d in rec.devices}):
            cdi_files.append(str(metadata.cdi_path(self.paths.cdi_root, self.paths.driver, rec.uid, request)))
            metadata_files.append(str(metadata.host_file(self.paths.metadata_dir, rec.namespace, rec.name, request)))
        return list(dict.fromkeys(cdi_files)), list(dict.fromkeys(metadata_files))

    # ------------------------------------------------------------ for the node manager and health
    def usage(self) -> Usage:
        """Devices held by prepared claims count as in use for the node manager."""
        mdevs: dict[str, list[str]] = {}
        pci: dict[str, list[str]] = {}
        for rec in self.cp.claims.values():
            who = f"ResourceClaim {rec.namespace}/{rec.name}"
            for d in rec.devices:
                if d.kind == "vgpu" and d.framework == "mdev" and d.vgpu_id:
                    mdevs.setdefault(d.vgpu_id, []).append(who)
                else:
                    pci.setdefault(d.vgpu_id or d.gpu, []).append(who)
        return Usage(mdevs=mdevs, pci=pci)

    def health(self) -> list[DeviceHealthRecord]:
        pool = self.pool()
        present = {}
        out = []
        for dev in pool.devices:
            if dev.gpu not in present:
                present[dev.gpu] = self.io.exists(self.env.pci(dev.gpu))
            out.append(DeviceHealthRecord(pool=self.pool_name, device=dev.name, healthy=present[dev.gpu]))
        return out
