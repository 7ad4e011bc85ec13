"""The kubelet plugin's driver: NodePrepareResources / NodeUnprepareResources.

Wiring only: claims come from a ClaimSource (:mod:`.claimsource`), devices from the
published pool, each claim's plan from :mod:`.claimplan`, effects from :mod:`.effects`, files
from :mod:`.cdi` and :mod:`.metadata`, the records of prepared claims from :mod:`.prepared`
(every change checkpointed before prepare answers), device health from :mod:`.health`.
Prepare is idempotent: a prepared claim answers from the checkpoint and creates nothing new.
A device another claim's record holds (the same device, or the same GPU whole against a vGPU
on it) is refused before anything is made (:func:`overlap`): the scheduler can allocate one
device twice.

Three things the node can do behind the plugin's back are handled here:

* a corrupted checkpoint is moved aside and the state rebuilt from the node (:mod:`.prepared`,
  :mod:`.recovery`); the plugin keeps serving and removes nothing;
* a reboot takes every vGPU, VF and tmpfs CDI spec with it: a claim prepared in an earlier
  boot (its record carries the boot id) is re-created on its next prepare, same vGPU UUIDs
  where the kernel allows, before the kubelet is answered, or answered with an error; and
  undoing such a record touches files only, never the kernel (the ids may name someone else's
  device now);
* names from API objects are checked before anything is made (:mod:`.paths`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.kubeletplugin import claimfiles, refcheck, specs
from dra_bridge.kubeletplugin.checkpoint import CheckpointStore
from dra_bridge.kubeletplugin.claimplan import GpuKey, plan_claim
from dra_bridge.kubeletplugin.claimsource import ClaimSource, allocation_results
from dra_bridge.kubeletplugin.effects import (
    PrepareError,
    bind_passthrough,
    create_instance,
    create_vgpu,
    creation_order,
    device_present,
    passthrough_moves,
    place_vgpu,
    placement_order,
    read_one_gpu,
    release_passthrough,
    remove_vgpu,
)
from dra_bridge.kubeletplugin.gpulocks import GpuLocks
from dra_bridge.kubeletplugin.health import device_health
from dra_bridge.kubeletplugin.overlap import overlap
from dra_bridge.kubeletplugin.prepared import PreparedClaims, load_or_rebuild
from dra_bridge.kubeletplugin.state import Checkpoint, ClaimRecord, PreparedDeviceRecord
from dra_bridge.pool.devices import Pool
from dra_bridge.rpc.types import ClaimRef, DeviceHealthRecord, PreparedDevice, PrepareResult
from mdev_manager.executor import Executor
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO, read_attr
from mdev_manager.models import Gpu, Usage

log = logging.getLogger(__name__)


class Driver:
    def __init__(self, *, env: HostEnv, paths: NodePaths, pool_name: str, claims: ClaimSource,
                 pool: Callable[[], Pool], io: HostIO | None = None):
        self.env = env
        self.io = io or RealIO()
        self.paths = paths
        self.pool_name = pool_name
        self.claims = claims
        self.pool = pool
        self.ex = Executor(env, self.io)
        store = CheckpointStore(paths.checkpoint, self.io)
        #: the prepared claims' records and their checkpoint (:mod:`.prepared`)
        self.prepared = PreparedClaims(store, load_or_rebuild(
            store, paths=paths, env=env, io=self.io, claims=claims, pool_name=pool_name, pool=pool,
            boot_id=self.boot_id))
        self.gpu_locks = GpuLocks()  # a claim's prepare and unprepare hold its GPUs' locks (.gpulocks)
        #: GPU -> why it is unhealthy, from the agent's health watch (None: presence on the bus only)
        self.gpu_health: Callable[[], Mapping[str, str]] | None = None
        #: told the GPUs a prepare or unprepare changed, after its effects (None: not known, every GPU)
        self.touched: Callable[[set[str] | None], None] | None = None
        #: the agent's state of a GPU in memory (:mod:`dra_bridge.agent.gpustate`); None: each prepare reads it
        self.gpu_state: Callable[[str], Gpu | None] | None = None

    @property
    def cp(self) -> Checkpoint:
        """The prepared claims' checkpoint in memory (the simulator, tests and benchmarks read it)."""
        return self.prepared.cp

    @property
    def store(self) -> CheckpointStore:
        """The checkpoint's file."""
        return self.prepared.store

    @property
    def writes(self) -> int:
        """Checkpoint files written (tests and benchmarks count them)."""
        return self.prepared.writes

    def records(self) -> list[ClaimRecord]:
        """Every claim's record now (a copy of the list: other GPUs' prepares change it meanwhile)."""
        return self.prepared.all()

    def usage(self) -> Usage:
        """Devices held by prepared claims count as in use for the node manager."""
        return self.prepared.usage()

    # ------------------------------------------------------------ start-up
    def boot_id(self) -> str | None:
        """The kernel's id of this boot; None where the host has none (then every record counts as this boot's)."""
        return read_attr(self.io, self.env.boot_id) or None

    def recover(self) -> list[str]:
        """Undo claims a crash left half-prepared (the kubelet prepares them again) or half-unprepared
        (the kubelet was unpreparing them: finish it)."""
        undone = []
        with self.prepared.lock:
            boot = self.boot_id()
            for uid, rec in list(self.prepared.cp.claims.items()):
                if rec.state in ("preparing", "unpreparing"):
                    try:
                        self._undo(rec, boot)
                    except OSError as exc:  # e.g. EBUSY: a VM holds the device; never forced
                        log.warning("claim %s: left %s by a crash, not undone yet (%s); its devices stay "
                                    "in use until the kubelet's next prepare or unprepare", refcheck.who(rec), rec.state, exc)
                        continue
                    self.prepared.drop(uid)
                    undone.append(uid)
            if undone:
                self.prepared.save()
        return undone

    # ------------------------------------------------------------ prepare
    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        """Each claim under its GPUs' locks only (:mod:`.gpulocks`): claims on other GPUs are prepared
        meanwhile by other calls."""
        out = {}
        boot = self.boot_id()
        for ref in creation_order(claims, {r.uid: r for r in self.records()}):
            keys, claim = self._lock_keys(ref)
            with self.gpu_locks.hold(keys):
                before = self.prepared.gpus_of(ref.uid)
                try:
                    out[ref.uid] = PrepareResult(devices=self._prepare_one(ref, boot, claim))
                except PrepareError as exc:
                    out[ref.uid] = PrepareResult(error=str(exc))
                except OSError as exc:
                    out[ref.uid] = PrepareResult(error=f"claim {ref.namespace}/{ref.name}: {exc}")
                self._tell(None if out[ref.uid].error else before | self.prepared.gpus_of(ref.uid))
        return out

    def _lock_keys(self, ref: ClaimRef) -> tuple[set[str], dict | None]:
        """The locks a claim's prepare holds: its name's, the GPUs its record names and those of the
        devices allocated to it (the claim is read for them once, here, before any lock is waited for);
        and the claim as read (None: not read, or unreadable: the prepare reads it and says why)."""
        keys = {f"claim:{ref.namespace}/{ref.name}"}
        rec = self.prepared.get(ref.uid)
        if rec is not None:
            keys |= {d.gpu for d in rec.devices}
            if rec.state == "prepared":
                return keys, None
        try:
            claim = self.claims.get(ref.namespace, ref.name)
            pool = self.pool()
            for r in allocation_results(claim):
                dev = pool.device(r.get("device", "")) if r.get("driver") == self.paths.driver else None
                if dev is not None:
                    keys.add(dev.gpu)
        except Exception:  # noqa: BLE001 - said by the prepare, which reads it again
            return keys, None
        return keys, claim

    def _tell(self, gpus: set[str] | None) -> None:
        """The agent's per-GPU state reads these GPUs again (a failed prepare: every GPU, its undo may
        have changed any GPU it reached)."""
        if self.touched is not None and gpus != set():
            self.touched(gpus)

    def _answer(self, rec: ClaimRecord) -> list[PreparedDevice]:
        return [PreparedDevice(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                               cdi_device_ids=d.cdi_ids) for d in rec.devices]

    def _prepare_one(self, ref: ClaimRef, boot: str | None, claim: dict | None = None) -> list[PreparedDevice]:
        refcheck.check_ref(ref)  # before anything is read, made or written
        known = self.prepared.get(ref.uid)
        if known and known.state == "prepared":
            refcheck.fill_identity(known, ref)
            taken = claimfiles.taken_over(self.io, self.paths, known)
            if taken:  # a container started now would mount the newer claim's device metadata
                raise PrepareError(f"claim {ref.namespace}/{ref.name} (uid {ref.uid}): its metadata file {taken[0][0]} "
                                   f"now describes uid {taken[0][1]}, a claim of the same name made since; not "
                                   "answering with another claim's device: unprepare this one (delete its pod)")
            if not self._of_this_boot(known, boot):
                return self._recreate(ref, known, boot, f"in an earlier boot ({known.boot_id or 'boot not recorded'})",
                                      claim)
            # the answer must name devices that exist: one removed behind the plugin's back (by
            # hand, by a tool that ignores claims) is made again, or the kubelet is told why not
            gone = [d.device for d in known.devices if not device_present(self.env, self.io, d)]
            if not gone:
                if self._files_missing(known):
                    self._rewrite_files(ref, known)
                return self._answer(known)
            return self._recreate(ref, known, boot, f"in this boot but {', '.join(gone)} vanished since", claim)
        if known:  # a previous attempt failed or crashed half-way: start clean
            self._undo(known, boot)
            self.prepared.drop(ref.uid)
            self.prepared.save()
        return self._prepare_new(ref, boot, claim=claim)

    def _of_this_boot(self, rec: ClaimRecord, boot: str | None) -> bool:
        """True when the record's devices are this boot's; a record of unknown boot (version 1, or
        rebuilt with a device missing) is adopted when the host holds every one of its devices.
        Where the host tells no boot id, nothing can be compared: the record is believed."""
        if boot is None or rec.boot_id == boot:
            return True
        if rec.boot_id is None and rec.devices and all(device_present(self.env, self.io, d) for d in rec.devices):
            rec.boot_id = boot
            self.prepared.save()
            return True
        return False

    def _recreate(self, ref: ClaimRef, old: ClaimRecord, boot: str | None, when: str,
                  claim: dict | None = None) -> list[PreparedDevice]:
        """A claim whose devices are gone (a reboot, a removal behind our back): make them again
        before answering. Only when none of them is left: one that exists may be a VM's."""
        where = f"claim {ref.namespace}/{ref.name}"
        held = self.prepared.held_elsewhere(ref.uid, boot)
        back = [d.vgpu_id or d.gpu for d in old.devices
                if device_present(self.env, self.io, d) and (d.vgpu_id or d.gpu) not in held]
        if back:
            raise PrepareError(f"{where} was prepared {when} and its devices {', '.join(back)} exist: not "
                               "re-creating over them; unprepare the claim (delete its pod) to start clean")
        self.prepared.drop(ref.uid)
        try:
            devices = self._prepare_new(ref, boot, prefer={d.device: d for d in old.devices}, claim=claim)
        except (PrepareError, OSError) as exc:
            self.prepared.put(old)  # kept: the next prepare tries again with the same ids
            self.prepared.save()
            raise PrepareError(f"{exc} (re-creating the devices it was prepared with {when})") from None
        new = self.prepared.cp.claims[ref.uid]
        same = sum(1 for d in new.devices if d.vgpu_id and d.vgpu_id == getattr(
            next((o for o in old.devices if o.device == d.device), None), "vgpu_id", None))
        log.info("%s: prepared %s; re-created %s (%s with the same id as before) and rewrote its CDI specs "
                 "and metadata", where, when, refcheck.n(len(new.devices), "device"), refcheck.n(same, "vGPU"))
        return devices

    def _prepare_new(self, ref: ClaimRef, boot: str | None,
                     prefer: dict[str, PreparedDeviceRecord] | None = None, claim: dict | None = None
                     ) -> list[PreparedDevice]:
        try:
            claim = claim or self.claims.get(ref.namespace, ref.name)
        except Exception as exc:  # API errors become the claim's error
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: cannot read it from the API server: {exc}") from None
        if claim["metadata"].get("uid") != ref.uid:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} has uid {claim['metadata'].get('uid')}, "
                               f"the kubelet asked for {ref.uid}")
        results = [r for r in allocation_results(claim) if r.get("driver") == self.paths.driver]
        if not results:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} has no devices allocated from {self.paths.driver}")
        refcheck.check_results(ref, claim, results)
        pool = self.pool()
        clash = overlap(ref, results, self.pool_name, pool,  # under its GPUs' locks, before any write
                        {r.uid: r for r in self.records()}, before=prefer)
        if clash:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} (uid {ref.uid}) refused, nothing prepared: {clash}")
        taken = self.prepared.recorded_vfs(ref.uid)
        records, gpus = plan_claim(ref, results, pool, prefer or {}, claim, taken, env=self.env, io=self.io, ex=self.ex,
                                   pool_name=self.pool_name, driver=self.paths.driver, holds=self.gpu_locks.holds,
                                   gpu_state=self.gpu_state)
        rec = ClaimRecord(uid=ref.uid, namespace=ref.namespace, name=ref.name, devices=records, boot_id=boot)
        self.prepared.put(rec)
        self.prepared.save()  # intent first: a crash from here on is undone by recover()
        try:
            self._apply(rec, claim, gpus)
        except (OSError, ValueError, PrepareError) as exc:
            self._undo(rec, boot)
            self.prepared.drop(ref.uid)
            self.prepared.save()
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: {exc}") from None
        rec.state = "prepared"
        self.prepared.save()
        return self._answer(rec)

    def _apply(self, rec: ClaimRecord, claim: dict, gpus: dict[GpuKey, Gpu]) -> None:
        """Make the devices (on the GPUs :func:`.claimplan.plan_claim` read), then the CDI specs and metadata."""
        for d in placement_order(rec.devices):  # one at a time: create, then move to its placement
            if d.kind == "vgpu":
                if d.gi_profile is not None:
                    create_instance(self.ex, d)
                    self.prepared.save()  # the instance's id, before its vGPU (crash safety)
                create_vgpu(self.ex, gpus[(d.gpu, d.type_id)], d)
                place_vgpu(self.ex, d)
            else:
                gpu = gpus[d.gpu]
                d.rebound = passthrough_moves(gpu)
                d.vfs_disabled = gpu.sriov_num_vfs
                self.prepared.save()  # what to give back, on disk before the first bind (crash safety)
                bind_passthrough(self.ex, gpu)
        self._write_files(rec, claim)

    def _write_files(self, rec: ClaimRecord, claim: dict) -> None:
        specs.write_files(self.env, self.io, self.paths, rec, claim)

    def _files_missing(self, rec: ClaimRecord) -> bool:
        """A prepared claim whose answer would name CDI devices that resolve to nothing."""
        return not rec.cdi_files or any(not d.cdi_ids for d in rec.devices) or \
            not all(self.io.exists(Path(f)) for f in rec.cdi_files + rec.metadata_files)

    def _rewrite_files(self, ref: ClaimRef, rec: ClaimRecord) -> None:
        """Write a prepared claim's files again (its devices exist): a rebuilt record that had none,
        specs lost with tmpfs. The claim is read again for its metadata."""
        where = f"claim {ref.namespace}/{ref.name}"
        if not (rec.namespace and rec.name and all(d.request for d in rec.devices)):
            raise PrepareError(f"{where}: its devices exist but its CDI specs are gone and the record does not say "
                               "which requests they serve; unprepare the claim (delete its pod) to start clean")
        try:
            claim = self.claims.get(ref.namespace, ref.name)
        except Exception as exc:  # API errors become the claim's error
            raise PrepareError(f"{where}: its CDI specs are gone and the claim cannot be read to write them again: "
                               f"{exc}") from None
        self._write_files(rec, claim)
        self.prepared.save()
        log.info("%s: prepared, its devices present; wrote its CDI specs and metadata again", where)

    # ------------------------------------------------------------ unprepare
    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        boot = self.boot_id()
        for ref in claims:
            rec = self.prepared.get(ref.uid)
            keys = {f"claim:{ref.namespace}/{ref.name}"} | ({d.gpu for d in rec.devices} if rec else set())
            with self.gpu_locks.hold(keys):
                rec = self.prepared.get(ref.uid)  # again under the locks: another call may have finished it
                if rec is None:
                    out[ref.uid] = None  # unknown claims are a no-op
                    continue
                refcheck.fill_identity(rec, ref)
                try:
                    out[ref.uid] = self._unprepare_one(ref, rec, boot)
                finally:
                    self._tell({d.gpu for d in rec.devices})
        return out

    def _unprepare_one(self, ref: ClaimRef, rec: ClaimRecord, boot: str | None) -> str | None:
        if rec.state != "unpreparing":  # intent first: a crash half-way is finished by recover()
            rec.state = "unpreparing"
            self.prepared.save()
        try:
            self._undo(rec, boot)
        except OSError as exc:
            return f"claim {ref.namespace}/{ref.name}: {exc}"
        # the files' removal durable before the record goes: after a power cut a claim's metadata
        # file could come back without its record, and a rebuild from the files (a corrupted
        # checkpoint, the API unreachable) took it for a prepared claim holding the device another
        # claim has since (found by the campaign, issue 36)
        self.io.sync()
        self.prepared.drop(ref.uid)
        self.prepared.save()
        return None

    def _undo(self, rec: ClaimRecord, boot: str | None) -> None:
        """Remove what prepare made; tolerant of parts that were never made.

        The kernel is touched only for a record of this boot (or of unknown boot, where removal
        goes by what the host shows), and never for a device another claim's record holds.
        """
        if refcheck.may_be_live(rec, boot):
            held = self.prepared.held_elsewhere(rec.uid, boot)
            for d in rec.devices:
                if (d.vgpu_id or d.gpu) in held:
                    continue
                if d.kind == "vgpu" and d.parent:
                    remove_vgpu(self.ex, self.env, self.io, d)
                elif d.kind == "passthrough" and (d.rebound or d.vfs_disabled):
                    release_passthrough(self.ex, read_one_gpu(self.env, self.io, d.gpu), d)
        # files by uid: a metadata file a re-created claim of the same name wrote stays (claimfiles)
        claimfiles.remove(self.io, self.paths, rec, self.records())

    # ------------------------------------------------------------ for the kubelet's health service
    def health(self) -> list[DeviceHealthRecord]:
        """Each published device's health (:mod:`.health`): as healthy as its GPU."""
        pool = self.pool()
        sick = dict(self.gpu_health()) if self.gpu_health is not None else {}
        return device_health(pool, self.pool_name, sick, self.env, self.io)
