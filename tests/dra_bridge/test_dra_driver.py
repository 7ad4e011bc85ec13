"""dra_bridge.kubeletplugin.driver: NodePrepareResources / NodeUnprepareResources on a simulated host.

Claims are real ResourceClaims in a local API server, read through ApiClaimSource; the
host is the simulated sysfs (mdev_manager.sim), so "the mdev exists" means the kernel
model holds it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.kubeletplugin import metadata
from dra_bridge.kubeletplugin.checkpoint import CheckpointStore
from dra_bridge.rpc.dra_grpc import parent_request_names
from dra_bridge.rpc.types import ClaimRef
from mdev_manager.executor import Executor
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import SimIO
from tests.support.dra import (
    DRA_LAYOUT,
    DRIVER,
    DictClaims,
    add_claim,
    cdi_device,
    cdi_problems,
    claim_object,
    devices_of,
    make_driver,
    make_node,
    read_json,
    read_metadata_stream,
    schema_validate,
)

T4_1Q, T4_2Q = "nvidia-230", "nvidia-231"
POD_CLAIM = metadata.POD_CLAIM_ANNOTATION


def prepare_ok(drv, ref: ClaimRef):
    res = drv.prepare([ref])[ref.uid]
    assert res.error is None, res.error
    return res.devices


def checkpoint_claims(paths: NodePaths) -> dict:
    return CheckpointStore(paths.checkpoint).load().claims


def files_under(*roots: Path) -> set[str]:
    return {str(p) for r in roots if r.exists() for p in r.rglob("*") if p.is_file()}


def plugin_files(paths: NodePaths) -> set[str]:
    """CDI specs and metadata files (the checkpoint itself excluded)."""
    return files_under(paths.cdi_root, paths.metadata_dir)


def metadata_file(paths: NodePaths, ref: ClaimRef, request: str) -> Path:
    return paths.metadata_dir / f"{ref.namespace}_{ref.name}" / request / "metadata.json"


def check_cdi_answer(paths: NodePaths, ref: ClaimRef, dev, *, group: int, iommufd_vfio: str | None = None):
    """The claim's CDI device: vfio nodes for ``group`` (and iommufd), specs that a strict parser accepts."""
    claim_ids = [i for i in dev.cdi_device_ids if i.startswith(f"{DRIVER}/claim=")]
    meta_ids = [i for i in dev.cdi_device_ids if i.startswith(f"{DRIVER}/metadata=")]
    assert len(claim_ids) == 1 and len(meta_ids) == 1, dev.cdi_device_ids
    spec, cdev = cdi_device(paths.cdi_root, claim_ids[0])
    assert cdi_problems(spec) == []
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == f"{DRIVER}/claim"
    assert cdev["name"] == f"{ref.uid}-{dev.device_name}"
    nodes = {n["path"]: n for n in cdev["containerEdits"]["deviceNodes"]}
    want = {"/dev/vfio/vfio", f"/dev/vfio/{group}"}
    if iommufd_vfio:
        want |= {"/dev/iommu", f"/dev/vfio/devices/{iommufd_vfio}"}
    assert set(nodes) == want
    for n in nodes.values():
        assert n["permissions"] == "rwm" and n["type"] == "c"
        assert os.path.exists(n["hostPath"]), f"{n['hostPath']} does not exist on the host"
    return spec, cdev, meta_ids[0]


def check_metadata(paths: NodePaths, ref: ClaimRef, meta_id: str, request: str, *, device: str,
                   attrs: dict, pod_claim: str | None = None):
    mspec, mdev = cdi_device(paths.cdi_root, meta_id)
    assert cdi_problems(mspec) == []
    assert mspec["kind"] == f"{DRIVER}/metadata" and mdev["name"] == f"{ref.uid}_{request}"
    (mount,) = mdev["containerEdits"]["mounts"]
    base = "/var/run/kubernetes.io/dra-device-attributes"
    if pod_claim:
        assert mount["containerPath"] == f"{base}/resourceclaimtemplates/{pod_claim}/{request}/{DRIVER}-metadata.json"
    else:
        assert mount["containerPath"] == f"{base}/resourceclaims/{ref.name}/{request}/{DRIVER}-metadata.json"
    assert mount["options"] == ["ro", "bind"]
    host = Path(mount["hostPath"])
    assert host == metadata_file(paths, ref, request)
    assert stat.S_IMODE(host.stat().st_mode) == 0o644
    docs = read_metadata_stream(host)
    assert len(docs) == 1
    doc = docs[0]
    assert doc["apiVersion"] == "metadata.resource.k8s.io/v1alpha1" and doc["kind"] == "DeviceMetadata"
    assert doc["metadata"]["name"] == ref.name and doc["metadata"]["namespace"] == ref.namespace
    assert doc["metadata"]["uid"] == ref.uid
    if pod_claim:
        assert doc["podClaimName"] == pod_claim
    else:
        assert "podClaimName" not in doc
    (req,) = doc["requests"]
    assert req["name"] == request
    (d,) = req["devices"]  # KubeVirt needs exactly one device per request
    assert d["driver"] == DRIVER and d["name"] == device
    assert d["attributes"] == attrs
    return doc


# --------------------------------------------------------------------------- prepare, per device kind


def test_prepare_mdev_vgpu_on_the_pf(srv, node, paths):
    pool = node.build_pool()
    gpu = "0000:10:00.0"
    dev_name = devices_of(pool, gpu, "vgpu", T4_1Q)[0]
    ref = add_claim(srv, "vm-a", [("vgpu", dev_name)], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    before = node.mdevs()
    (dev,) = prepare_ok(drv, ref)
    assert (dev.device_name, dev.pool_name, dev.request_names) == (dev_name, node.node, ["vgpu"])

    (new,) = node.mdevs() - before
    mdev_dir = node.env.pci(gpu) / new
    assert os.path.basename(os.readlink(mdev_dir / "mdev_type")) == T4_1Q
    group = int(os.path.basename(os.readlink(mdev_dir / "iommu_group")))
    _, _, meta_id = check_cdi_answer(paths, ref, dev, group=group)
    check_metadata(paths, ref, meta_id, "vgpu", device=dev_name, attrs={"mdevUUID": {"string": new}})

    cp = checkpoint_claims(paths)[ref.uid]
    assert cp.state == "prepared" and (cp.namespace, cp.name) == ("default", "vm-a")
    (rec,) = cp.devices
    assert (rec.kind, rec.framework, rec.vgpu_id, rec.parent, rec.type_id) == ("vgpu", "mdev", new, gpu, T4_1Q)
    assert rec.cdi_ids == dev.cdi_device_ids


def test_prepare_mdev_on_an_sriov_vf(srv, node, paths):
    pool = node.build_pool()
    gpu = "0000:16:00.0"  # A100: mdev on VFs
    dev_name = devices_of(pool, gpu, "vgpu")[0]
    ref = add_claim(srv, "vm-b", [("vgpu", dev_name)], node=node.node)
    (dev,) = prepare_ok(make_driver(node, paths, srv.api_client(), pool), ref)
    (v,) = node.gpu(gpu).vgpus
    assert v.framework == "mdev" and v.parent != gpu
    assert v.parent in {vf.address for vf in node.gpu(gpu).vfs}
    assert v.id in node.mdevs()
    _, _, meta_id = check_cdi_answer(paths, ref, dev, group=v.iommu_group)
    check_metadata(paths, ref, meta_id, "vgpu", device=dev_name, attrs={"mdevUUID": {"string": v.id}})


def test_prepare_vendor_vfio_sets_the_vf_type(srv, node, paths):
    pool = node.build_pool()
    gpu = "0000:19:00.0"  # L40S: NVIDIA vendor-specific VFIO
    dev_name = devices_of(pool, gpu, "vgpu")[0]
    type_id = pool.device(dev_name).type_id
    ref = add_claim(srv, "vm-c", [("vgpu", dev_name)], node=node.node)
    (dev,) = prepare_ok(make_driver(node, paths, srv.api_client(), pool), ref)
    (v,) = node.gpu(gpu).vgpus
    assert v.framework == "vendor-vfio" and v.type_id == type_id
    assert node.current_vgpu_type(v.parent) == type_id
    assert node.mdevs() == set()
    vf_group = int(os.path.basename(os.readlink(node.env.pci(v.parent) / "iommu_group")))
    _, _, meta_id = check_cdi_answer(paths, ref, dev, group=vf_group)
    # KubeVirt passes a vendor-VFIO VF as a PCI device
    check_metadata(paths, ref, meta_id, "vgpu", device=dev_name,
                   attrs={"resource.kubernetes.io/pciBusID": {"string": v.parent}})


def test_two_vgpus_of_one_claim_get_distinct_parents(srv, node, paths):
    pool = node.build_pool()
    gpu = "0000:19:00.0"
    a, b = devices_of(pool, gpu, "vgpu")[:2]
    ref = add_claim(srv, "vm-two", [("first", a), ("second", b)], node=node.node)
    devs = prepare_ok(make_driver(node, paths, srv.api_client(), pool), ref)
    assert sorted(d.device_name for d in devs) == sorted([a, b])
    vgpus = node.gpu(gpu).vgpus
    assert len(vgpus) == 2 and len({v.parent for v in vgpus}) == 2
    spec_files = list(paths.cdi_root.glob(f"{DRIVER}-claim_*.json"))
    assert len(spec_files) == 1, "one CDI spec per claim"
    assert {d["name"] for d in read_json(spec_files[0])["devices"]} == {f"{ref.uid}-{a}", f"{ref.uid}-{b}"}
    assert metadata_file(paths, ref, "first").exists() and metadata_file(paths, ref, "second").exists()


@pytest.mark.parametrize("preset,gpu,others", [
    ("workstation", "0000:10:00.0", ["0000:10:00.1"]),  # T4 with its audio function in the group
    ("default", "0000:13:00.0", []),
])
def test_passthrough_binds_the_whole_group_and_unprepare_gives_it_back(srv, tmp_path, paths, preset, gpu, others):
    node = make_node(tmp_path, preset)
    pool = node.build_pool()
    natives = {a: node.driver_of(a) for a in [gpu, *others]}
    assert "vfio-pci" not in natives.values()
    (dev_name,) = devices_of(pool, gpu, "passthrough")
    ref = add_claim(srv, "vm-pt", [("gpu", dev_name)], node=node.node, annotations={POD_CLAIM: "gpu-claim"})
    drv = make_driver(node, paths, srv.api_client(), pool)
    (dev,) = prepare_ok(drv, ref)
    for a in natives:
        assert node.driver_of(a) == "vfio-pci", f"{a} not bound to vfio-pci"
    g = node.gpu(gpu)
    assert sorted(g.iommu_group_members) == sorted(natives)
    _, _, meta_id = check_cdi_answer(paths, ref, dev, group=g.iommu_group)
    check_metadata(paths, ref, meta_id, "gpu", device=dev_name, pod_claim="gpu-claim",
                   attrs={"resource.kubernetes.io/pciBusID": {"string": gpu}})
    assert sorted(checkpoint_claims(paths)[ref.uid].devices[0].rebound) == sorted(natives)

    assert drv.unprepare([ref]) == {ref.uid: None}
    assert {a: node.driver_of(a) for a in natives} == natives
    assert not (node.env.vfio_dir / str(g.iommu_group)).exists()
    assert plugin_files(paths) == set()
    assert ref.uid not in checkpoint_claims(paths)


def test_passthrough_of_a_gpu_already_on_vfio_pci_leaves_it_there(srv, node, paths):
    gpu = "0000:13:00.0"
    Executor(node.env, node.io).bind(gpu, "vfio-pci")  # the admin bound it
    pool = node.build_pool()
    (dev_name,) = devices_of(pool, gpu, "passthrough")
    ref = add_claim(srv, "vm-pt2", [("gpu", dev_name)], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    prepare_ok(drv, ref)
    assert checkpoint_claims(paths)[ref.uid].devices[0].rebound == []
    assert drv.unprepare([ref]) == {ref.uid: None}
    assert node.driver_of(gpu) == "vfio-pci", "unprepare moved a GPU that prepare did not move"


def test_passthrough_with_iommufd_adds_its_device_nodes(srv, tmp_path, paths):
    node = make_node(tmp_path, "l40s-node", prepare_gpus=False)  # cold boot: VFs off, whole GPUs offered
    pool = node.build_pool()
    gpu = "0000:10:00.0"
    (dev_name,) = devices_of(pool, gpu, "passthrough")
    ref = add_claim(srv, "vm-fd", [("gpu", dev_name)], node=node.node)
    (dev,) = prepare_ok(make_driver(node, paths, srv.api_client(), pool), ref)
    g = node.gpu(gpu)
    assert g.driver == "vfio-pci" and g.vfio_dev
    _, cdev, _ = check_cdi_answer(paths, ref, dev, group=g.iommu_group, iommufd_vfio=g.vfio_dev)
    nodes = {n["path"]: n["hostPath"] for n in cdev["containerEdits"]["deviceNodes"]}
    assert nodes["/dev/iommu"] == str(node.env.iommufd)


@pytest.mark.parametrize("preset_spec, board", [("l40s-node", "L40S"), (None, "T4")])
def test_vgpu_with_iommufd_adds_its_own_cdev(srv, tmp_path, paths, preset_spec, board):
    """With iommufd, a vGPU's container gets /dev/iommu and the vGPU's own /dev/vfio/devices/vfioN."""
    if preset_spec is None:  # an mdev vGPU on an iommufd host
        (tmp_path / "presets").mkdir()
        preset_spec = tmp_path / "presets" / "t4-fd.yaml"
        preset_spec.write_text("name: t4-fd\nnode: sim-t4-fd\niommufd: true\ngpus:\n  - board: T4\n")
    node = make_node(tmp_path, str(preset_spec))
    pool = node.build_pool()
    gpu = node.host.gpus()[0]["pf"]
    dev_name = devices_of(pool, gpu, "vgpu")[0]
    ref = add_claim(srv, "vm-fd-vgpu", [("vgpu", dev_name)], node=node.node)
    (dev,) = prepare_ok(make_driver(node, paths, srv.api_client(), pool), ref)
    (v,) = node.gpu(gpu).vgpus
    sysdir = node.env.mdev_devices / v.id if v.framework == "mdev" else node.env.pci(v.parent)
    (cdev_name,) = os.listdir(sysdir / "vfio-dev")
    group = int(os.path.basename(os.readlink(sysdir / "iommu_group")))
    check_cdi_answer(paths, ref, dev, group=group, iommufd_vfio=cdev_name)
    assert make_driver(node, paths, srv.api_client(), pool).unprepare([ref]) == {ref.uid: None}
    assert not (node.env.vfio_dir / "devices" / cdev_name).exists()  # gone with the vGPU


def test_subrequest_uses_the_base_request_in_paths(srv, node, paths):
    pool = node.build_pool()
    dev_name = devices_of(pool, "0000:10:00.0", "vgpu")[0]
    obj = claim_object("vm-sub", [("vgpu/small", dev_name)], node=node.node)
    obj["spec"]["devices"]["requests"] = [{"name": "vgpu", "firstAvailable": [
        {"name": "small", "deviceClassName": "vgpu.kubevirt.io"}]}]
    stored = srv.add(obj)
    ref = ClaimRef(namespace="default", name="vm-sub", uid=stored["metadata"]["uid"])
    (dev,) = prepare_ok(make_driver(node, paths, srv.api_client(), pool), ref)
    # The driver names the sub-request the scheduler chose; the gRPC layer answers the kubelet
    # with the parent request (a container's claim names only "vgpu"), as the upstream helper's
    # stripSubrequestNames does (tests/dra_bridge/test_grpc_plugin.py checks the wire side).
    assert dev.request_names == ["vgpu/small"]
    assert parent_request_names(dev.request_names) == ["vgpu"]
    meta_id = next(i for i in dev.cdi_device_ids if "/metadata=" in i)
    assert meta_id == f"{DRIVER}/metadata={ref.uid}_vgpu"
    (v,) = node.gpu("0000:10:00.0").vgpus
    check_metadata(paths, ref, meta_id, "vgpu", device=dev_name, attrs={"mdevUUID": {"string": v.id}})


def test_claims_used_here_are_valid_api_objects(node):
    """The claims the tests store are what the API server of every version accepts."""
    obj = claim_object("vm-x", [("vgpu", "gpu-0-vgpu-t4-1q-0")], node=node.node, annotations={POD_CLAIM: "x"})
    for v in ("1.34", "1.35", "1.36", "1.37"):
        schema_validate(obj, v)


# --------------------------------------------------------------------------- ordering, idempotence, restart


class RecordingIO(SimIO):
    def __init__(self, host):
        super().__init__(host)
        self.log: list[tuple[str, str]] = []

    def write(self, path, data):
        self.log.append(("write", str(path)))
        super().write(path, data)

    def write_atomic(self, path, data, **kw):
        self.log.append(("atomic", str(path)))
        super().write_atomic(path, data, **kw)


def test_checkpoint_written_last_before_answering(srv, node, paths):
    pool = node.build_pool()
    dev_name = devices_of(pool, "0000:10:00.0", "vgpu")[0]
    ref = add_claim(srv, "vm-order", [("vgpu", dev_name)], node=node.node)
    io = RecordingIO(node.host)
    drv = make_driver(node, paths, srv.api_client(), pool, io=io)
    prepare_ok(drv, ref)
    kinds = []
    for _op, p in io.log:
        if p == str(paths.checkpoint):
            kinds.append("checkpoint")
        elif p.endswith("/create"):
            kinds.append("create")
        elif p.startswith(str(paths.cdi_root)):
            kinds.append("cdi")
        elif p.startswith(str(paths.metadata_dir)):
            kinds.append("metadata")
    assert kinds[0] == "checkpoint", "the intent must be on disk before the vGPU is created"
    assert kinds[-1] == "checkpoint", "the answer must come after the final checkpoint"
    assert kinds.index("create") < kinds.index("cdi") and "metadata" in kinds
    # the file is whole and self-checking
    doc = read_json(paths.checkpoint)
    assert set(doc) == {"checksum", "data"} and ref.uid in doc["data"]["claims"]
    assert not list(paths.checkpoint.parent.glob(".*.tmp"))


def test_prepare_twice_is_idempotent(srv, node, paths):
    pool = node.build_pool()
    v_name = devices_of(pool, "0000:10:00.0", "vgpu")[0]
    p_name = devices_of(pool, "0000:13:00.0", "passthrough")[0]
    ref = add_claim(srv, "vm-idem", [("vgpu", v_name), ("gpu", p_name)], node=node.node)
    io = RecordingIO(node.host)
    drv = make_driver(node, paths, srv.api_client(), pool, io=io)
    first = drv.prepare([ref])[ref.uid]
    assert first.error is None
    mdevs, files = node.mdevs(), {f: Path(f).read_bytes() for f in plugin_files(paths)}
    io.log.clear()
    second = drv.prepare([ref])[ref.uid]
    assert second == first
    assert node.mdevs() == mdevs
    assert [op for op in io.log if op[0] == "write"] == [], "a repeated prepare touched the kernel"
    assert {f: Path(f).read_bytes() for f in plugin_files(paths)} == files


def test_restart_answers_from_the_checkpoint(srv, node, paths):
    pool = node.build_pool()
    dev_name = devices_of(pool, "0000:10:00.0", "vgpu")[0]
    ref = add_claim(srv, "vm-restart", [("vgpu", dev_name)], node=node.node)
    first = make_driver(node, paths, srv.api_client(), pool).prepare([ref])[ref.uid]
    mdevs = node.mdevs()

    again = make_driver(node, paths, srv.api_client(), pool)  # a new process on the same paths
    assert again.recover() == []
    srv.reset_counters()
    assert again.prepare([ref])[ref.uid] == first
    assert node.mdevs() == mdevs
    assert again.unprepare([ref]) == {ref.uid: None}
    assert node.mdevs() == set() and plugin_files(paths) == set()



class SyncRecordingIO(RecordingIO):
    """RecordingIO that also records removals and syncs (what makes a removal durable)."""

    def remove(self, path):
        self.log.append(("remove", str(path)))
        super().remove(path)

    def sync(self):
        self.log.append(("sync", ""))
        super().sync()


def test_unprepare_makes_the_files_removal_durable_before_the_checkpoint_forgets_the_claim(srv, node, paths):
    """Issue 36 (the campaign, seed 1): after a power cut a removed claim's metadata file came back without
    its record, and a rebuild from the files took it for a prepared claim holding a device another claim
    had since. The removals are synced before the checkpoint that forgets the claim is written."""
    pool = node.build_pool()
    dev_name = devices_of(pool, "0000:10:00.0", "vgpu")[0]
    ref = add_claim(srv, "vm-durable", [("vgpu", dev_name)], node=node.node)
    io = SyncRecordingIO(node.host)
    drv = make_driver(node, paths, srv.api_client(), pool, io=io)
    prepare_ok(drv, ref)
    io.log.clear()
    assert drv.unprepare([ref]) == {ref.uid: None}
    removed = [i for i, (op, p) in enumerate(io.log) if op == "remove" and p.startswith(str(paths.metadata_dir))]
    forgets = [i for i, (op, p) in enumerate(io.log) if op == "atomic" and p == str(paths.checkpoint)]
    assert removed and forgets, io.log
    synced = [i for i, (op, _) in enumerate(io.log) if op == "sync"]
    assert any(max(removed) < i < forgets[-1] for i in synced), f"no sync between the removals and the checkpoint: {io.log}"


# --------------------------------------------------------------------------- crash between create and checkpoint


class Crash(BaseException):
    """The process dies: nothing after this point runs."""


class CrashAfterWrite(SimIO):
    """Lets the write reach the kernel, then kills the 'process'."""

    def __init__(self, host, when):
        super().__init__(host)
        self.when = when
        self.fired = False

    def write(self, path, data):
        super().write(path, data)
        if not self.fired and self.when(Path(path), data):
            self.fired = True
            raise Crash(str(path))


@pytest.mark.parametrize("gpu,trigger", [
    ("0000:10:00.0", lambda p, d: p.name == "create"),  # mdev on the PF
    ("0000:16:00.0", lambda p, d: p.name == "create"),  # mdev on a VF
    ("0000:19:00.0", lambda p, d: p.name == "current_vgpu_type" and d.strip() != "0"),  # vendor VFIO
])
def test_vgpu_created_but_not_checkpointed_is_removed_at_start(node, paths, gpu, trigger):
    pool = node.build_pool()
    dev_name = devices_of(pool, gpu, "vgpu")[0]
    claims = DictClaims()
    ref = claims.add(claim_object("vm-crash", [("vgpu", dev_name)], node=node.node), uid="6f1c1c2e-0000-4000-8000-000000000001")
    crashing = make_driver(node, paths, claims, pool, io=CrashAfterWrite(node.host, trigger))
    with pytest.raises(Crash):
        crashing.prepare([ref])
    assert len(node.gpu(gpu).vgpus) == 1, "the crash should leave the vGPU behind"
    assert checkpoint_claims(paths)[ref.uid].state == "preparing"

    restarted = make_driver(node, paths, claims, pool)
    assert restarted.recover() == [ref.uid]
    assert node.gpu(gpu).vgpus == [] and node.mdevs() == set()
    assert checkpoint_claims(paths) == {}
    assert plugin_files(paths) == set()
    # the kubelet retries: prepare works from a clean state
    (dev,) = prepare_ok(restarted, ref)
    assert len(node.gpu(gpu).vgpus) == 1


def test_passthrough_bound_but_not_checkpointed_is_released_at_start(node, paths):
    gpu = "0000:13:00.0"
    pool = node.build_pool()
    (dev_name,) = devices_of(pool, gpu, "passthrough")
    claims = DictClaims()
    ref = claims.add(claim_object("vm-crash-pt", [("gpu", dev_name)], node=node.node), uid="6f1c1c2e-0000-4000-8000-000000000002")
    crashing = make_driver(node, paths, claims, pool,
                           io=CrashAfterWrite(node.host, lambda p, d: p.name == "drivers_probe"))
    with pytest.raises(Crash):
        crashing.prepare([ref])
    assert node.driver_of(gpu) == "vfio-pci"
    restarted = make_driver(node, paths, claims, pool)
    assert restarted.recover() == [ref.uid]
    assert node.driver_of(gpu) == "nvidia", "a crash left the GPU on vfio-pci with nobody to give it back"


def test_crash_after_files_before_final_checkpoint_cleans_files(node, paths):
    pool = node.build_pool()
    dev_name = devices_of(pool, "0000:10:00.0", "vgpu")[0]
    claims = DictClaims()
    ref = claims.add(claim_object("vm-crash-late", [("vgpu", dev_name)], node=node.node),
                     uid="6f1c1c2e-0000-4000-8000-000000000003")

    class CrashOnFinalCheckpoint(SimIO):
        def write_atomic(self, path, data, **kw):
            if Path(path) == paths.checkpoint and '"prepared"' in data:
                raise Crash("before the final checkpoint")
            super().write_atomic(path, data, **kw)

    with pytest.raises(Crash):
        make_driver(node, paths, claims, pool, io=CrashOnFinalCheckpoint(node.host)).prepare([ref])
    assert plugin_files(paths), "CDI and metadata files were written before the crash"
    restarted = make_driver(node, paths, claims, pool)
    assert restarted.recover() == [ref.uid]
    assert plugin_files(paths) == set() and node.mdevs() == set()


# --------------------------------------------------------------------------- unprepare


def test_unprepare_removes_everything_prepare_made(srv, node, paths):
    pool = node.build_pool()
    names = [devices_of(pool, "0000:10:00.0", "vgpu")[0], devices_of(pool, "0000:19:00.0", "vgpu")[0],
             devices_of(pool, "0000:13:00.0", "passthrough")[0]]
    ref = add_claim(srv, "vm-all", [("a", names[0]), ("b", names[1]), ("c", names[2])], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    prepare_ok(drv, ref)
    assert node.vgpu_ids() and node.driver_of("0000:13:00.0") == "vfio-pci"
    assert drv.unprepare([ref]) == {ref.uid: None}
    assert node.vgpu_ids() == set() and node.mdevs() == set()
    assert all(node.current_vgpu_type(v.address) == "0" for v in node.gpu("0000:19:00.0").vfs)
    assert node.driver_of("0000:13:00.0") == "nvidia"
    assert plugin_files(paths) == set()
    assert not (paths.metadata_dir / "default_vm-all").exists()
    assert checkpoint_claims(paths) == {}
    # twice: a no-op
    assert drv.unprepare([ref]) == {ref.uid: None}


def test_unprepare_unknown_claim_is_a_noop(srv, node, paths):
    pool = node.build_pool()
    ref = add_claim(srv, "vm-keep", [("vgpu", devices_of(pool, "0000:10:00.0", "vgpu")[0])], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    prepare_ok(drv, ref)
    mdevs, files = node.mdevs(), plugin_files(paths)
    unknown = ClaimRef(namespace="default", name="never-seen", uid="00000000-0000-4000-8000-00000000dead")
    assert drv.unprepare([unknown]) == {unknown.uid: None}
    assert node.mdevs() == mdevs and plugin_files(paths) == files
    assert set(checkpoint_claims(paths)) == {ref.uid}


# --------------------------------------------------------------------------- per-claim errors


def test_bad_claims_get_per_claim_errors_and_good_ones_still_prepare(srv, node, paths):
    pool = node.build_pool()
    t4 = devices_of(pool, "0000:10:00.0", "vgpu")
    good = add_claim(srv, "good", [("vgpu", t4[0])], node=node.node)
    other_node = add_claim(srv, "other-node", [("vgpu", t4[1])], node="sim-node-2")
    other_driver = add_claim(srv, "other-driver", [("vgpu", t4[2])], node=node.node, driver="gpu.example.com")
    gone_device = add_claim(srv, "gone-device", [("vgpu", "gpu-9-vgpu-t4-1q-0")], node=node.node)
    mixed = add_claim(srv, "mixed", [("vgpu", t4[3]), ("other", "gpu-9-vgpu-t4-1q-1")], node=node.node)
    missing = ClaimRef(namespace="default", name="not-in-api", uid="00000000-0000-4000-8000-000000000404")
    wrong_uid = ClaimRef(namespace="default", name="good", uid="00000000-0000-4000-8000-000000000409")
    unallocated_obj = claim_object("unallocated", [("vgpu", t4[4])], node=node.node)
    del unallocated_obj["status"]
    st = srv.add(unallocated_obj)
    unallocated = ClaimRef(namespace="default", name="unallocated", uid=st["metadata"]["uid"])

    drv = make_driver(node, paths, srv.api_client(), pool)
    refs = [other_node, good, other_driver, gone_device, mixed, missing, wrong_uid, unallocated]
    out = drv.prepare(refs)
    assert set(out) == {r.uid for r in refs}
    assert out[good.uid].error is None and len(out[good.uid].devices) == 1
    for bad, words in [(other_node, "sim-node-2"), (other_driver, DRIVER), (gone_device, "gpu-9-vgpu-t4-1q-0"),
                       (mixed, "gpu-9-vgpu-t4-1q-1"), (missing, "not-in-api"), (wrong_uid, wrong_uid.uid),
                       (unallocated, DRIVER)]:
        assert out[bad.uid].error, f"{bad.name} was prepared"
        assert words in out[bad.uid].error, out[bad.uid].error
        assert out[bad.uid].devices == []
    assert len(node.mdevs()) == 1, "only the good claim may create a vGPU"
    assert set(checkpoint_claims(paths)) == {good.uid}
    assert {p.name for p in paths.cdi_root.iterdir()} == {
        f"{DRIVER}-claim_{good.uid}.json", f"{DRIVER}_metadata_{good.uid}_vgpu.json"}


def test_gpu_that_disappeared_is_a_claim_error(srv, node, paths):
    pool = node.build_pool()  # still lists the GPU: the resync has not run yet
    dev_name = devices_of(pool, "0000:13:00.0", "vgpu")[0]
    ref = add_claim(srv, "vm-hotplug", [("vgpu", dev_name)], node=node.node)
    node.host.remove_gpu("0000:13:00.0")
    res = make_driver(node, paths, srv.api_client(), pool).prepare([ref])[ref.uid]
    assert res.error and "0000:13:00.0" in res.error
    assert checkpoint_claims(paths) == {} and plugin_files(paths) == set()


def test_vgpu_type_mismatch_on_an_equal_size_gpu_is_a_claim_error(srv, tmp_path, paths):
    node = make_node(tmp_path, "default", version=(1, 37))  # 1.37: every size published, groups keep them apart
    pool = node.build_pool()
    gpu = "0000:10:00.0"
    one_q, two_q = devices_of(pool, gpu, "vgpu", T4_1Q)[0], devices_of(pool, gpu, "vgpu", T4_2Q)[0]
    first = add_claim(srv, "vm-1q", [("vgpu", one_q)], node=node.node)
    second = add_claim(srv, "vm-2q", [("vgpu", two_q)], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    prepare_ok(drv, first)
    res = drv.prepare([second])[second.uid]
    assert res.error and "T4-1Q" in res.error, res.error
    (v,) = node.gpu(gpu).vgpus
    assert v.type_id == T4_1Q
    assert set(checkpoint_claims(paths)) == {first.uid}
    # once the 1Q vGPU is gone the 2Q claim fits
    assert drv.unprepare([first]) == {first.uid: None}
    prepare_ok(drv, second)
    assert [v.type_id for v in node.gpu(gpu).vgpus] == [T4_2Q]


def test_passthrough_of_a_gpu_holding_vgpus_is_a_claim_error(srv, node, paths):
    pool = node.build_pool()
    gpu = "0000:10:00.0"
    vgpu = add_claim(srv, "vm-v", [("vgpu", devices_of(pool, gpu, "vgpu")[0])], node=node.node)
    whole = add_claim(srv, "vm-w", [("gpu", devices_of(pool, gpu, "passthrough")[0])], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    prepare_ok(drv, vgpu)
    res = drv.prepare([whole])[whole.uid]
    assert res.error and gpu in res.error
    assert node.driver_of(gpu) == "nvidia" and len(node.gpu(gpu).vgpus) == 1


def test_failure_half_way_undoes_the_claim(srv, node, paths):
    """A claim whose second device cannot be made leaves nothing of its first."""
    pool = node.build_pool()
    gpu = "0000:16:00.0"  # A100 on 1.35: one size, 10 instances, but 16 VFs
    names = devices_of(pool, gpu, "vgpu")
    drv = make_driver(node, paths, srv.api_client(), pool)
    filler = add_claim(srv, "fill", [(f"r{i}", n) for i, n in enumerate(names[:9])], node=node.node)
    prepare_ok(drv, filler)
    held = node.mdevs()
    # one instance is left; a claim for two more vGPUs (an over-allocation the scheduler would not make)
    # gets the first made, then fails on the second
    greedy = add_claim(srv, "greedy", [("a", names[9]), ("b", names[8])], node=node.node)
    res = drv.prepare([greedy])[greedy.uid]
    assert res.error
    assert node.mdevs() == held, "the first device of the failed claim was left behind"
    assert set(checkpoint_claims(paths)) == {filler.uid}
    assert not list(paths.cdi_root.glob(f"*{greedy.uid}*"))


def test_checkpoint_with_bad_checksum_is_moved_aside_not_trusted(node, paths, caplog):
    """Issue #12 point 6: a bad checksum no longer stops the plugin; the file is kept aside and not
    believed (tests/dra_bridge/test_checkpoint.py covers every kind of corruption)."""
    paths.checkpoint.parent.mkdir(parents=True)
    body = json.dumps({"checksum": "0" * 64, "data": {"version": 1, "claims": {}}})
    paths.checkpoint.write_text(body)
    drv = make_driver(node, paths, DictClaims(), node.build_pool())
    assert drv.cp.claims == {}
    (aside,) = paths.checkpoint.parent.glob("checkpoint.json.corrupt-*")
    assert aside.read_text() == body
    assert any("checksum" in r.getMessage() for r in caplog.records)


def test_passthrough_of_a_dra_gpu_with_idle_vfs_turns_them_off_and_back_on(srv, tmp_path, paths):
    node = make_node(tmp_path, "default")  # the dra layout enabled the A100's 16 VFs
    gpu = "0000:16:00.0"
    assert node.gpu(gpu).sriov_num_vfs == 16
    pool = node.build_pool()
    (dev_name,) = devices_of(pool, gpu, "passthrough")
    ref = add_claim(srv, "vm-a100", [("gpu", dev_name)], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    prepare_ok(drv, ref)
    g = node.gpu(gpu)
    assert g.sriov_num_vfs == 0 and g.driver == "vfio-pci"
    assert checkpoint_claims(paths)[ref.uid].devices[0].vfs_disabled == 16
    assert drv.unprepare([ref]) == {ref.uid: None}
    g = node.gpu(gpu)
    assert g.driver == "nvidia" and g.sriov_num_vfs == 16 and g.framework == "mdev-sriov"


def test_passthrough_is_refused_while_a_vf_holds_a_vgpu(srv, tmp_path, paths):
    node = make_node(tmp_path, "default")
    gpu = "0000:16:00.0"
    pool = node.build_pool()
    (vgpu_dev,) = devices_of(pool, gpu, "vgpu")[:1]
    ref = add_claim(srv, "vm-vgpu", [("vgpu", vgpu_dev)], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    prepare_ok(drv, ref)
    (pt,) = devices_of(pool, gpu, "passthrough")
    ref2 = add_claim(srv, "vm-pt", [("gpu", pt)], node=node.node)
    res = drv.prepare([ref2])[ref2.uid]
    assert res.error and "holds vGPUs" in res.error
    assert node.gpu(gpu).sriov_num_vfs == 16 and len(node.gpu(gpu).vgpus) == 1


# --------------------------------------------------------------------------- one device, one claim (issue #12 point 2)


T4 = "0000:10:00.0"


def snapshot(node, paths: NodePaths, gpu: str = T4):
    """What a refused prepare must leave as it was: the kernel's devices, the GPU's driver, every plugin file."""
    return (node.mdevs(), [(v.id, v.parent, v.type_id) for v in node.gpu(gpu).vgpus], node.driver_of(gpu),
            {f: Path(f).read_bytes() for f in plugin_files(paths)})


def assert_names_both(error: str | None, ours: ClaimRef, theirs: ClaimRef, *devices: str):
    assert error, "the second claim was prepared"
    for words in (f"{ours.namespace}/{ours.name}", ours.uid, f"{theirs.namespace}/{theirs.name}", theirs.uid,
                  *devices):
        assert words in error, f"{words!r} missing from: {error}"


def test_two_claims_on_one_vgpu_device_only_the_first_prepares(srv, node, paths):
    """A scheduler race or a force-deleted pod allocates one published vGPU slot twice: the T4
    could make a second vGPU, so without the check both would prepare."""
    pool = node.build_pool()
    dev_name = devices_of(pool, T4, "vgpu", T4_1Q)[0]
    first = add_claim(srv, "vm-a", [("vgpu", dev_name)], node=node.node)
    second = add_claim(srv, "vm-b", [("vgpu", dev_name)], node=node.node, namespace="tenant")
    drv = make_driver(node, paths, srv.api_client(), pool)
    answer = drv.prepare([first])[first.uid]
    assert answer.error is None
    before, record = snapshot(node, paths), checkpoint_claims(paths)[first.uid]

    res = drv.prepare([second])[second.uid]
    assert_names_both(res.error, second, first, dev_name)
    assert res.devices == []
    assert snapshot(node, paths) == before, "the refused claim made something"
    assert checkpoint_claims(paths) == {first.uid: record}, "the first claim's record changed"
    # the first is untouched: the same claim again is idempotent, not a clash with itself
    assert drv.prepare([first])[first.uid] == answer
    # a restarted plugin knows from the checkpoint, and one call with both claims answers each
    again = make_driver(node, paths, srv.api_client(), pool)
    both = again.prepare([first, second])
    assert both[first.uid] == answer
    assert_names_both(both[second.uid].error, second, first, dev_name)
    assert snapshot(node, paths) == before

    # once the first claim is unprepared the kubelet's retry prepares the second
    assert again.unprepare([first]) == {first.uid: None}
    (dev,) = prepare_ok(again, second)
    assert dev.device_name == dev_name
    (v,) = node.gpu(T4).vgpus
    assert set(checkpoint_claims(paths)) == {second.uid} and node.mdevs() == {v.id}


@pytest.mark.parametrize("first_kind", ["passthrough", "vgpu"])
def test_a_whole_gpu_and_a_vgpu_on_it_never_both_prepare(srv, node, paths, first_kind):
    """Two device names, one physical GPU: the passthrough record and a vGPU record name the same GPU."""
    pool = node.build_pool()
    names = {"passthrough": devices_of(pool, T4, "passthrough")[0], "vgpu": devices_of(pool, T4, "vgpu")[0]}
    second_kind = "vgpu" if first_kind == "passthrough" else "passthrough"
    first = add_claim(srv, "vm-a", [("gpu", names[first_kind])], node=node.node)
    second = add_claim(srv, "vm-b", [("gpu", names[second_kind])], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    prepare_ok(drv, first)
    before, record = snapshot(node, paths), checkpoint_claims(paths)[first.uid]

    res = drv.prepare([second])[second.uid]
    assert_names_both(res.error, second, first, names["passthrough"], names["vgpu"], T4)
    assert snapshot(node, paths) == before and checkpoint_claims(paths) == {first.uid: record}

    assert drv.unprepare([first]) == {first.uid: None}
    prepare_ok(drv, second)
    if second_kind == "passthrough":
        assert node.driver_of(T4) == "vfio-pci" and node.mdevs() == set()
    else:
        assert node.driver_of(T4) == "nvidia" and len(node.gpu(T4).vgpus) == 1


def test_one_device_twice_in_one_claim_is_refused(srv, node, paths):
    pool = node.build_pool()
    dev_name = devices_of(pool, T4, "vgpu")[0]
    ref = add_claim(srv, "vm-twice", [("a", dev_name), ("b", dev_name)], node=node.node)
    res = make_driver(node, paths, srv.api_client(), pool).prepare([ref])[ref.uid]
    assert res.error and dev_name in res.error and "request a" in res.error, res.error
    assert node.mdevs() == set() and plugin_files(paths) == set() and checkpoint_claims(paths) == {}


def test_a_claim_from_before_a_reboot_still_holds_its_device(srv, node, paths):
    """After a reboot the first claim's vGPU is gone but its claim is still allocated: its next
    prepare re-creates it, so a second claim on that device must not take it meanwhile."""
    pool = node.build_pool()
    dev_name = devices_of(pool, T4, "vgpu")[0]
    first = add_claim(srv, "vm-a", [("vgpu", dev_name)], node=node.node)
    second = add_claim(srv, "vm-b", [("vgpu", dev_name)], node=node.node)
    prepare_ok(make_driver(node, paths, srv.api_client(), pool), first)
    node.host.reboot()
    shutil.rmtree(paths.cdi_root)
    assert reconcile(node.env, node.io, DRA_LAYOUT, node=node.node).ok
    assert node.mdevs() == set()

    drv = make_driver(node, paths, srv.api_client(), node.build_pool())
    assert drv.cp.claims[first.uid].boot_id != drv.boot_id()
    res = drv.prepare([second])[second.uid]
    assert_names_both(res.error, second, first, dev_name)
    assert node.mdevs() == set() and set(checkpoint_claims(paths)) == {first.uid}
    (dev,) = prepare_ok(drv, first)  # re-created, same device
    assert dev.device_name == dev_name and len(node.mdevs()) == 1
    assert drv.prepare([second])[second.uid].error
    assert drv.unprepare([first]) == {first.uid: None}
    prepare_ok(drv, second)


# --------------------------------------------------------------------------- metadata once per request (#12 point 9b)


def test_metadata_cdi_device_only_on_the_first_device_of_a_request(srv, node, paths):
    """Upstream's helper injects the metadata CDI device into the first device of each request
    (k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go): one bind mount per request.
    The driver used to add it to every device of the request, so a request of two devices named
    the same mount twice."""
    pool = node.build_pool()
    a, b = devices_of(pool, T4, "vgpu", T4_1Q)[:2]
    c = devices_of(pool, "0000:19:00.0", "vgpu")[0]
    ref = add_claim(srv, "vm-multi", [("vgpu", a), ("vgpu", b), ("other", c)], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    devs = prepare_ok(drv, ref)
    assert [d.device_name for d in devs] == [a, b, c]
    meta = {d.device_name: [i for i in d.cdi_device_ids if i.startswith(f"{DRIVER}/metadata=")] for d in devs}
    assert meta == {a: [f"{DRIVER}/metadata={ref.uid}_vgpu"], b: [], c: [f"{DRIVER}/metadata={ref.uid}_other"]}
    for d in devs:  # every device keeps its own vfio device
        own = [i for i in d.cdi_device_ids if i.startswith(f"{DRIVER}/claim=")]
        assert own == [f"{DRIVER}/claim={ref.uid}-{d.device_name}"]
    # the request's one metadata file lists both of its devices
    (doc,) = read_metadata_stream(metadata_file(paths, ref, "vgpu"))
    assert [d["name"] for d in doc["requests"][0]["devices"]] == [a, b]
    assert drv.prepare([ref])[ref.uid].devices == devs  # the checkpoint answers the same


# --------------------------------------------------------------------------- health


def test_health_names_the_gpu_in_each_message(node, paths):
    pool = node.build_pool()
    drv = make_driver(node, paths, DictClaims(), pool)
    before = {r.device: r for r in drv.health()}
    assert set(before) == {d.name for d in pool.devices}
    gone = "0000:13:00.0"
    on_gone = set(devices_of(pool, gone, "passthrough") + devices_of(pool, gone, "vgpu"))
    assert on_gone
    for d in pool.devices:
        assert (before[d.name].healthy, before[d.name].message) == (True, f"GPU {d.gpu} present")
    node.host.remove_gpu(gone)
    after = {r.device: r for r in drv.health()}
    for d in pool.devices:
        if d.name in on_gone:
            assert (after[d.name].healthy, after[d.name].message) == (False, f"GPU {gone} is gone from the PCI bus")
        else:
            assert (after[d.name].healthy, after[d.name].message) == (True, f"GPU {d.gpu} present")
