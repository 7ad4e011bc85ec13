"""Issue #23 point 9: a claim deleted and re-created under the same namespace and name (a VM
restarted) gets a new uid, and its KEP-5304 metadata file has the old claim's path
(``<ns>_<name>/<request>/metadata.json``: KubeVirt reads it by name). The old uid's unprepare,
usually after the new claim's prepare, must leave the new claim's files as they are; so must a
crash on either side, the old claim's repair, and a rebuilt checkpoint (:mod:`.claimfiles`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dra_bridge.kubeletplugin import cdi, metadata
from dra_bridge.kubeletplugin.checkpoint import CheckpointStore
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import SimIO
from tests.dra_bridge.test_checkpoint import check_resolves
from tests.support.dra import DRA_LAYOUT, DRIVER, DictClaims, claim_object, devices_of, make_driver, read_metadata_stream

T4 = "0000:10:00.0"
OLD = "6f1c1c2e-0000-4000-8000-00000000c001"
NEW = "6f1c1c2e-0000-4000-8000-00000000c002"


class Crash(BaseException):
    """The process dies: nothing after this point runs."""


class CrashingIO(SimIO):
    """Kills the 'process' at the first write ``when`` picks (before it, or after it with ``after``)."""

    def __init__(self, host, when, after: bool = False):
        super().__init__(host)
        self.when, self.after = when, after

    def write(self, path, data):
        if not self.after and self.when(Path(path)):
            raise Crash(str(path))
        super().write(path, data)
        if self.after and self.when(Path(path)):
            raise Crash(str(path))

    def write_atomic(self, path, data, **kw):
        if not self.after and self.when(Path(path)):
            raise Crash(str(path))
        super().write_atomic(path, data, **kw)
        if self.after and self.when(Path(path)):
            raise Crash(str(path))


@pytest.fixture
def vm(node, paths):
    """Claim default/vm-gpu prepared as uid OLD, then re-created as uid NEW (another vGPU) in the API."""
    pool = node.build_pool()
    claims = DictClaims()
    devs = devices_of(pool, T4, "vgpu")
    old = claims.add(claim_object("vm-gpu", [("gpu", devs[0])], node=node.node), uid=OLD)
    drv = make_driver(node, paths, claims, pool)
    assert drv.prepare([old])[old.uid].error is None
    new = claims.add(claim_object("vm-gpu", [("gpu", devs[1])], node=node.node), uid=NEW)  # the VM restarted
    return drv, claims, pool, old, new


def meta_file(paths) -> Path:
    return paths.metadata_dir / "default_vm-gpu" / "gpu" / "metadata.json"


def owner_and_vgpu(paths) -> tuple[str, str]:
    (doc,) = read_metadata_stream(meta_file(paths))
    (dev,) = doc["requests"][0]["devices"]
    return doc["metadata"]["uid"], dev["attributes"]["mdevUUID"]["string"]


def specs_of(paths, uid: str) -> set[str]:
    return {f.name for f in paths.cdi_root.iterdir()
            if uid in (cdi.parse_spec_name(DRIVER, f.name), metadata.parse_cdi_name(DRIVER, f.name))}


def claim_spec(uid: str) -> str:
    return f"{DRIVER}-claim_{uid}.json"


def vgpu_of(drv, uid: str) -> str:
    (d,) = drv.cp.claims[uid].devices
    return d.vgpu_id


def test_the_old_uids_unprepare_leaves_the_new_claims_files(node, paths, vm):
    drv, _claims, _pool, old, new = vm
    old_vgpu = vgpu_of(drv, OLD)
    answer = drv.prepare([new])[NEW]
    assert answer.error is None
    new_vgpu = vgpu_of(drv, NEW)
    assert owner_and_vgpu(paths) == (NEW, new_vgpu)  # the new claim took the path over
    new_specs, text = specs_of(paths, NEW), meta_file(paths).read_text()
    # and the old claim's CDI device for that file is gone: it would mount the new claim's file
    assert len(new_specs) == 2 and specs_of(paths, OLD) == {claim_spec(OLD)}

    assert drv.unprepare([old]) == {OLD: None}
    assert specs_of(paths, OLD) == set() and old_vgpu not in node.mdevs()
    assert meta_file(paths).read_text() == text and specs_of(paths, NEW) == new_specs
    assert new_vgpu in node.mdevs()
    check_resolves(paths, drv.prepare([new])[NEW])  # the new claim still answers, every CDI id resolving

    assert drv.unprepare([new]) == {NEW: None}
    assert not (paths.metadata_dir / "default_vm-gpu").exists() and list(paths.cdi_root.iterdir()) == []


def test_the_new_uid_unprepared_first_then_the_old(node, paths, vm):
    drv, _claims, _pool, old, new = vm
    assert drv.prepare([new])[NEW].error is None
    assert drv.unprepare([new]) == {NEW: None}
    assert not meta_file(paths).exists() and specs_of(paths, NEW) == set()
    assert specs_of(paths, OLD) == {claim_spec(OLD)} and vgpu_of(drv, OLD) in node.mdevs()
    assert drv.unprepare([old]) == {OLD: None}
    assert list(paths.cdi_root.iterdir()) == [] and not (paths.metadata_dir / "default_vm-gpu").exists()
    assert node.mdevs() == set()


@pytest.mark.parametrize("api_has", ["new", "none"])
def test_the_old_uid_stays_unanswered_once_the_new_claim_is_unprepared(node, paths, vm, api_has):
    """The shared file left with the new claim; the old claim (its pod lingering) is not given a
    metadata file back, nor answered, whether the API holds the new claim or none of the name (the
    campaign's invariant relies on this: seed 1, step 107)."""
    drv, claims, _pool, old, new = vm
    assert drv.prepare([new])[NEW].error is None
    assert drv.unprepare([new]) == {NEW: None}
    if api_has == "none":
        del claims.claims[("default", "vm-gpu")]
    error = drv.prepare([old])[OLD].error
    assert error and (f"now uid {NEW}" in error if api_has == "new" else "cannot be read" in error)
    assert not meta_file(paths).exists() and specs_of(paths, OLD) == {claim_spec(OLD)}
    assert drv.unprepare([old]) == {OLD: None}
    assert list(paths.cdi_root.iterdir()) == [] and not (paths.metadata_dir / "default_vm-gpu").exists()


def test_the_old_uid_is_not_answered_with_the_new_claims_metadata(node, paths, vm):
    """A container of the old pod started now would mount the new claim's file (its vGPU's UUID)."""
    drv, _claims, _pool, old, new = vm
    assert drv.prepare([new])[NEW].error is None
    text = meta_file(paths).read_text()
    error = drv.prepare([old])[OLD].error
    assert error and f"now describes uid {NEW}" in error
    assert meta_file(paths).read_text() == text


def test_the_old_uid_never_writes_the_new_claims_path(node, paths, vm):
    """Its CDI specs lost (tmpfs), the old claim's repair reads the claim by name and finds the new
    uid: nothing is written for it (before, the new claim's object went into the old claim's files);
    a first prepare of the old uid after the new one is refused the same way."""
    drv, claims, pool, old, new = vm
    before = meta_file(paths).read_text()
    shutil.rmtree(paths.cdi_root)
    error = drv.prepare([old])[OLD].error
    assert error and f"now uid {NEW}" in error
    assert meta_file(paths).read_text() == before and not paths.cdi_root.exists()

    assert drv.prepare([new])[NEW].error is None
    text = meta_file(paths).read_text()
    assert drv.unprepare([old]) == {OLD: None}
    late = drv.prepare([old])[OLD].error  # the kubelet retries the old pod's claim
    assert late and f"has uid {NEW}" in late
    assert meta_file(paths).read_text() == text and owner_and_vgpu(paths) == (NEW, vgpu_of(drv, NEW))


def test_a_crash_in_the_new_claims_prepare_before_its_files_leaves_the_old_ones(node, paths, vm):
    """The new claim's intent is on disk, its vGPU made, then the process dies: the restart undoes
    the new claim and the old claim's metadata (still its own) and specs stay."""
    drv, claims, pool, old, new = vm
    text, old_specs = meta_file(paths).read_text(), specs_of(paths, OLD)
    crashing = make_driver(node, paths, claims, pool, io=CrashingIO(node.host, lambda p: p.name == "create",
                                                                     after=True))
    with pytest.raises(Crash):
        crashing.prepare([new])
    restarted = make_driver(node, paths, claims, pool)
    assert restarted.recover() == [NEW]
    assert meta_file(paths).read_text() == text and specs_of(paths, OLD) == old_specs
    assert node.mdevs() == {vgpu_of(restarted, OLD)}


def test_a_crash_in_the_new_claims_prepare_after_its_files_removes_only_its_own(node, paths, vm):
    drv, claims, pool, old, new = vm

    class CrashOnFinalCheckpoint(SimIO):
        def write_atomic(self, path, data, **kw):
            if Path(path) == paths.checkpoint and NEW in data and '"prepared"' in json.dumps(
                    json.loads(data)["data"]["claims"][NEW]):
                raise Crash("before the final checkpoint")
            super().write_atomic(path, data, **kw)

    with pytest.raises(Crash):
        make_driver(node, paths, claims, pool, io=CrashOnFinalCheckpoint(node.host)).prepare([new])
    assert owner_and_vgpu(paths)[0] == NEW and specs_of(paths, NEW)
    restarted = make_driver(node, paths, claims, pool)
    assert restarted.recover() == [NEW]
    assert not meta_file(paths).exists() and specs_of(paths, NEW) == set()  # the new claim's, its own
    assert specs_of(paths, OLD) == {claim_spec(OLD)} and node.mdevs() == {vgpu_of(restarted, OLD)}


def test_a_crash_in_the_old_uids_unprepare_is_finished_without_the_new_claims_files(node, paths, vm):
    """The old uid's unprepare records its intent, then dies before removing anything; the restart
    finishes it, and the new claim's metadata (same path) and specs stay."""
    drv, claims, pool, old, new = vm
    assert drv.prepare([new])[NEW].error is None
    text, new_specs, new_vgpu = meta_file(paths).read_text(), specs_of(paths, NEW), vgpu_of(drv, NEW)
    crashing = make_driver(node, paths, claims, pool, io=CrashingIO(node.host, lambda p: p.name == "remove"))
    with pytest.raises(Crash):
        crashing.unprepare([old])
    assert CheckpointStore(paths.checkpoint).load().claims[OLD].state == "unpreparing"
    restarted = make_driver(node, paths, claims, pool)
    assert restarted.recover() == [OLD]
    assert meta_file(paths).read_text() == text and specs_of(paths, NEW) == new_specs
    assert specs_of(paths, OLD) == set() and node.mdevs() == {new_vgpu}
    check_resolves(paths, restarted.prepare([new])[NEW])


def test_a_rebuilt_checkpoint_gives_the_shared_file_to_the_uid_it_names(node, paths, vm):
    drv, claims, pool, old, new = vm
    assert drv.prepare([new])[NEW].error is None
    old_vgpu, new_vgpu = vgpu_of(drv, OLD), vgpu_of(drv, NEW)
    text, new_specs = meta_file(paths).read_text(), specs_of(paths, NEW)
    paths.checkpoint.write_text("{")
    rebuilt = make_driver(node, paths, claims, pool)
    recs = rebuilt.cp.claims
    assert recs[NEW].metadata_files == [str(meta_file(paths))] and recs[OLD].metadata_files == []
    assert recs[OLD].cdi_files == [str(paths.cdi_root / claim_spec(OLD))]
    assert (vgpu_of(rebuilt, OLD), vgpu_of(rebuilt, NEW)) == (old_vgpu, new_vgpu)

    assert rebuilt.unprepare([old]) == {OLD: None}
    assert meta_file(paths).read_text() == text and specs_of(paths, NEW) == new_specs
    assert specs_of(paths, OLD) == set() and node.mdevs() == {new_vgpu}
    check_resolves(paths, rebuilt.prepare([new])[NEW])
    assert rebuilt.unprepare([new]) == {NEW: None}
    assert node.mdevs() == set() and list(paths.cdi_root.iterdir()) == []


class PageCacheIO(SimIO):
    """Writes not yet made durable (no ``durable`` write, no sync) are lost at ``power_loss``."""

    def __init__(self, host):
        super().__init__(host)
        self.pending: dict[Path, bytes | None] = {}

    def _before(self, path) -> None:
        path = Path(path)
        if path not in self.pending:
            self.pending[path] = path.read_bytes() if path.is_file() else None

    def write_atomic(self, path, data, durable=True):
        if not durable:
            self._before(path)
        super().write_atomic(path, data, durable=durable)
        if durable:
            self.pending.pop(Path(path), None)

    def remove(self, path):
        self._before(path)
        super().remove(path)

    def sync(self):
        self.pending.clear()
        super().sync()

    def power_loss(self) -> None:
        for path, old in self.pending.items():
            if old is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(old)
        self.pending.clear()


def test_a_power_cut_after_the_new_claims_prepare_keeps_its_metadata_file(node, paths):
    """The new claim's prepare was answered (its checkpoint record durable), then the power failed:
    its take-over of the shared metadata file must not be lost with the page cache, or after the
    reboot the file names the old uid again and the new claim is refused as if the old one were
    newer (while the old pod lingers)."""
    io = PageCacheIO(node.host)
    pool = node.build_pool()
    claims = DictClaims()
    devs = devices_of(pool, T4, "vgpu")
    old = claims.add(claim_object("vm-gpu", [("gpu", devs[0])], node=node.node), uid=OLD)
    drv = make_driver(node, paths, claims, pool, io=io)
    assert drv.prepare([old])[OLD].error is None
    io.sync()  # the old claim's files long written back
    new = claims.add(claim_object("vm-gpu", [("gpu", devs[1])], node=node.node), uid=NEW)
    assert drv.prepare([new])[NEW].error is None
    io.power_loss()
    node.host.reboot()
    shutil.rmtree(paths.cdi_root)
    assert reconcile(node.env, node.io, DRA_LAYOUT, node=node.node).ok
    drv = make_driver(node, paths, claims, node.build_pool(), io=io)
    drv.recover()
    answer = drv.prepare([new])[NEW]
    assert answer.error is None, answer.error
    assert owner_and_vgpu(paths)[0] == NEW
