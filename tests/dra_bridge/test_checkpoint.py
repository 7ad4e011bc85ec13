"""The kubelet plugin's node safety (issue #12, points 3, 6 and 7) on a simulated host.

* A corrupted checkpoint is moved aside, the state rebuilt from the node, the plugin keeps
  serving, no prepared claim's device is removed, and one log line says what was recovered;
  a rebuilt claim still holds its devices against other claims (point 2).
* The checkpoint is versioned: a version 1 file (what the plugin wrote before) is migrated.
* After a reboot, a checkpointed claim's devices are made again before prepare answers
  (CDI ids resolve), or prepare answers with a clear error.
* Names from API objects never steer a write: a ``../``, an absolute path or a bad uid is
  refused, naming the field, before anything is made.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from dra_bridge.kubeletplugin import checkpoint as ckpt
from dra_bridge.kubeletplugin.checkpoint import CheckpointCorrupt, CheckpointStore
from dra_bridge.kubeletplugin.state import ClaimRecord
from dra_bridge.rpc.types import ClaimRef
from mdev_manager.reconcile import reconcile
from tests.support.dra import (
    DRA_LAYOUT,
    DRIVER,
    DictClaims,
    boot_id_file,
    cdi_device,
    claim_object,
    devices_of,
    make_driver,
    read_metadata_stream,
)
from tests.support.simnodes import file_tree

LOGGER = "dra_bridge.kubeletplugin"
T4, A100, PT, L40S = "0000:10:00.0", "0000:16:00.0", "0000:13:00.0", "0000:19:00.0"
UID_VGPUS = "6f1c1c2e-0000-4000-8000-00000000a001"
UID_PT = "6f1c1c2e-0000-4000-8000-00000000a002"


def prepared(node, paths):
    """Two claims prepared: three vGPUs (mdev on a PF, mdev on a VF, vendor VFIO) and a passed-through GPU."""
    pool = node.build_pool()
    claims = DictClaims()
    vgpus = claims.add(claim_object("vm-vgpus", [("t4", devices_of(pool, T4, "vgpu")[0]),
                                                 ("a100", devices_of(pool, A100, "vgpu")[0]),
                                                 ("l40s", devices_of(pool, L40S, "vgpu")[0])], node=node.node),
                       uid=UID_VGPUS)
    whole = claims.add(claim_object("vm-pt", [("gpu", devices_of(pool, PT, "passthrough")[0])], node=node.node,
                                    namespace="tenant"), uid=UID_PT)
    drv = make_driver(node, paths, claims, pool)
    answers = drv.prepare([vgpus, whole])
    assert all(a.error is None for a in answers.values()), answers
    return claims, pool, [vgpus, whole], answers


def host_state(node):
    """What the kernel holds: mdevs, vendor-VFIO types set, drivers of the passthrough GPU."""
    vendor = {vf.address: node.current_vgpu_type(vf.address) for vf in node.gpu(L40S).vfs}
    return node.mdevs(), {a: t for a, t in vendor.items() if t != "0"}, node.driver_of(PT)



def check_resolves(paths, answer):
    """Every CDI id of every device resolves to one device whose vfio nodes exist on the host."""
    for dev in answer.devices:
        for cid in dev.cdi_device_ids:
            _, cdev = cdi_device(paths.cdi_root, cid)
            for n in cdev["containerEdits"].get("deviceNodes") or []:
                assert os.path.exists(n["hostPath"]), f"{cid}: {n['hostPath']} does not exist"
            for m in cdev["containerEdits"].get("mounts") or []:
                assert os.path.exists(m["hostPath"]), f"{cid}: {m['hostPath']} does not exist"


def norm(answers):
    """Answers with each claim's devices in device-name order (a rebuilt record lists them so)."""
    return {uid: (a.error, sorted(a.devices, key=lambda d: d.device_name)) for uid, a in answers.items()}


def plugin_warnings(caplog):
    return [r for r in caplog.records if r.name.startswith(LOGGER) and r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- corruption


def _valid_body(path: Path) -> str:
    return path.read_text()


def _resigned(body: str, change) -> str:
    """The checkpoint with ``change`` applied to its data and a correct checksum again."""
    doc = json.loads(body)
    change(doc["data"])
    data = doc["data"]
    return json.dumps({"checksum": ckpt._digest(json.dumps(data, sort_keys=True)), "data": data})


CORRUPTIONS = {
    "empty": lambda body: "",
    "truncated": lambda body: body[: len(body) // 2],
    "random-bytes": lambda body: os.urandom(512),
    "bad-checksum": lambda body: body.replace('"prepared"', '"preparing"', 1),
    "json-null": lambda body: "null",
    "json-list": lambda body: json.dumps([json.loads(body)]),
    "directory": None,
    "symlink-to-dev-zero": None,
    "unknown-version": lambda body: _resigned(body, lambda d: d.update(version=99)),
    "record-uid-escapes": lambda body: _resigned(
        body, lambda d: next(iter(d["claims"].values())).update(uid="../../etc")),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupted_checkpoint_is_kept_aside_and_the_state_rebuilt(node, paths, caplog, case):
    claims, pool, refs, first = prepared(node, paths)
    held = host_state(node)
    body = _valid_body(paths.checkpoint)
    if case == "directory":
        paths.checkpoint.unlink()
        paths.checkpoint.mkdir()
        (paths.checkpoint / "inside").write_text("x")
    elif case == "symlink-to-dev-zero":  # never read: it has no end
        paths.checkpoint.unlink()
        paths.checkpoint.symlink_to("/dev/zero")
    else:
        bad = CORRUPTIONS[case](body)
        (paths.checkpoint.write_bytes if isinstance(bad, bytes) else paths.checkpoint.write_text)(bad)
    kept = file_tree(paths.checkpoint.parent)[paths.checkpoint.name]  # content, "dir" or "-> target"

    caplog.set_level(logging.INFO, logger=LOGGER)
    drv = make_driver(node, paths, claims, pool)  # the plugin restarts: it must not raise
    assert drv.recover() == []

    (line,) = plugin_warnings(caplog)  # one line says what was recovered
    msg = line.getMessage()
    assert str(paths.checkpoint) in msg and "recovered 2 prepared claims" in msg, msg
    assert "default/vm-vgpus" in msg and "tenant/vm-pt" in msg
    (aside,) = paths.checkpoint.parent.glob("checkpoint.json.corrupt-*")
    assert file_tree(aside.parent)[aside.name] == kept  # kept as it was
    if case == "directory":
        assert (aside / "inside").read_text() == "x"
    assert CheckpointStore(paths.checkpoint).load().claims.keys() == {UID_VGPUS, UID_PT}

    # no device was removed, and the claims are still prepared: the same answers, nothing created
    assert host_state(node) == held
    again = drv.prepare(refs)
    assert norm(again) == norm(first)
    assert host_state(node) == held
    for a in again.values():
        check_resolves(paths, a)
    usage = drv.usage()
    assert set(usage.mdevs) == held[0]
    assert set(held[1]) | {PT} <= set(usage.pci)
    assert usage.claims_of(PT) and usage.claims_of(PT) == usage.pci[PT]  # the claim's: not a block in dra mode

    # and the plugin keeps working: unprepare gives the vGPUs back
    assert drv.unprepare(refs) == {r.uid: None for r in refs}
    assert node.mdevs() == set() and host_state(node)[1] == {}


def test_rebuild_from_the_cdi_spec_alone(node, paths, caplog):
    """Metadata files gone too: the claim spec's vfio groups still find the vGPUs."""
    claims, pool, refs, first = prepared(node, paths)
    held = host_state(node)
    shutil.rmtree(paths.metadata_dir)
    for f in paths.cdi_root.glob(f"{DRIVER}_metadata_*"):
        f.unlink()
    paths.checkpoint.write_text("{")
    drv = make_driver(node, paths, claims, pool)
    rec = drv.cp.claims[UID_VGPUS]
    assert (rec.namespace, rec.state) == ("", "prepared")
    assert {d.vgpu_id for d in rec.devices if d.framework == "mdev"} == held[0]
    assert {d.vgpu_id for d in rec.devices if d.framework == "vendor-vfio"} == set(held[1])
    assert "uid " + UID_VGPUS in plugin_warnings(caplog)[0].getMessage()
    assert drv.unprepare([refs[0]]) == {UID_VGPUS: None}
    assert node.mdevs() == set() and host_state(node)[1] == {}


@pytest.mark.parametrize("spec_alone", [False, True])
def test_rebuilt_claims_still_hold_their_devices(node, paths, spec_alone):
    """Issue #12 point 2 after point 6: a record rebuilt from the node holds its devices like any
    other, so a second claim on one of them (or a vGPU on the passed-through GPU) is refused,
    naming the recovered claim, even when only its uid is known."""
    claims, pool, refs, first = prepared(node, paths)
    held = host_state(node)
    if spec_alone:
        shutil.rmtree(paths.metadata_dir)
        for f in paths.cdi_root.glob(f"{DRIVER}_metadata_*"):
            f.unlink()
    paths.checkpoint.write_text("{")
    drv = make_driver(node, paths, claims, pool)
    t4_dev = devices_of(pool, T4, "vgpu")[0]
    pt_vgpu = devices_of(pool, PT, "vgpu")[0]
    same = claims.add(claim_object("vm-same", [("t4", t4_dev)], node=node.node),
                      uid="6f1c1c2e-0000-4000-8000-00000000b001")
    on_pt = claims.add(claim_object("vm-on-pt", [("v", pt_vgpu)], node=node.node),
                       uid="6f1c1c2e-0000-4000-8000-00000000b002")
    out = drv.prepare([same, on_pt])
    for ref, holder, dev in [(same, UID_VGPUS, t4_dev), (on_pt, UID_PT, pt_vgpu)]:
        err = out[ref.uid].error
        assert err and holder in err and ref.uid in err and f"default/{ref.name}" in err and dev in err, err
    if not spec_alone:
        assert "default/vm-vgpus" in out[same.uid].error and "tenant/vm-pt" in out[on_pt.uid].error
    assert host_state(node) == held and set(drv.cp.claims) == {UID_VGPUS, UID_PT}


@pytest.mark.parametrize("text, words", [
    ("", "not JSON"), ("{", "not JSON"), ("null", "not a checkpoint"), ("[]", "not a checkpoint"),
    ('{"data": {}}', "not a checkpoint"), ('{"checksum": "x", "data": {"version": 2}}', "checksum"),
])
def test_parse_names_what_is_wrong(text, words):
    with pytest.raises(CheckpointCorrupt, match=words):
        ckpt.parse(text)


@pytest.mark.parametrize("version", [0, ckpt.CURRENT_VERSION + 1, 99, "2", None, 1.5, True])
def test_unknown_versions_are_corrupt(version):
    data = {"version": version, "claims": {}}
    body = json.dumps({"checksum": ckpt._digest(json.dumps(data, sort_keys=True)), "data": data})
    with pytest.raises(CheckpointCorrupt, match="version"):
        ckpt.parse(body)


def test_a_checkpoint_that_cannot_be_moved_aside_still_does_not_stop_the_plugin(node, paths, caplog, monkeypatch):
    claims, pool, refs, first = prepared(node, paths)
    paths.checkpoint.write_text("null")

    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(CheckpointStore, "quarantine", refuse)
    drv = make_driver(node, paths, claims, pool)
    assert norm(drv.prepare(refs)) == norm(first)
    assert "could not be moved aside" in plugin_warnings(caplog)[0].getMessage()


# --------------------------------------------------------------------------- versions


def as_version_1(body: str) -> str:
    """The file as the plugin wrote it before boot ids: version 1, no ``boot_id``."""
    doc = json.loads(body)
    data = doc["data"]
    data["version"] = 1
    for rec in data["claims"].values():
        rec.pop("boot_id")
    return json.dumps({"checksum": ckpt._digest(json.dumps(data, sort_keys=True)), "data": data}, sort_keys=True)


def test_version_1_is_migrated_and_its_claims_adopted(node, paths, caplog):
    claims, pool, refs, first = prepared(node, paths)
    held = host_state(node)
    paths.checkpoint.write_text(as_version_1(paths.checkpoint.read_text()))
    cp = CheckpointStore(paths.checkpoint).load()
    assert cp.version == ckpt.CURRENT_VERSION
    assert all(r.boot_id is None and r.state == "prepared" for r in cp.claims.values())

    drv = make_driver(node, paths, claims, pool)
    assert plugin_warnings(caplog) == [] and drv.recover() == []
    assert drv.prepare(refs) == first  # devices all on the host: this boot's, answered as they are
    assert host_state(node) == held
    doc = json.loads(paths.checkpoint.read_text())
    assert doc["data"]["version"] == ckpt.CURRENT_VERSION
    assert {r["boot_id"] for r in doc["data"]["claims"].values()} == {drv.boot_id()}
    assert not list(paths.checkpoint.parent.glob("*.corrupt-*"))


def test_migration_steps_reach_the_current_version():
    assert sorted(ckpt.MIGRATIONS) == list(range(1, ckpt.CURRENT_VERSION))
    out = ckpt._v1_to_v2({"version": 1, "claims": {UID_PT: {"uid": UID_PT, "namespace": "a", "name": "b"}}})
    assert out == {"version": 2, "claims": {UID_PT: {"uid": UID_PT, "namespace": "a", "name": "b", "boot_id": None}}}


def test_a_newer_file_keeps_older_readers_working():
    """Versions only add fields: version 1's model (pydantic ignores unknown fields) reads a version 2 record."""
    rec = ClaimRecord(uid=UID_PT, namespace="a", name="b", boot_id="x").model_dump(mode="json")
    rec.pop("boot_id")
    assert ClaimRecord.model_validate(rec).boot_id is None


# --------------------------------------------------------------------------- reboot


def test_the_simulated_kernel_changes_its_boot_id_at_each_reboot(node):
    seen = {boot_id_file(node).read_text()}
    for _ in range(2):
        node.host.reboot()
        text = boot_id_file(node).read_text()
        assert text.endswith("\n") and text not in seen
        seen.add(text)


def test_a_host_without_boot_id_answers_from_the_checkpoint(node, paths):
    """No boot id to compare: every record counts as this boot's (the behaviour before boot ids)."""
    boot_id_file(node).unlink()
    claims, pool, refs, first = prepared(node, paths)
    drv = make_driver(node, paths, claims, pool)
    assert drv.boot_id() is None and {r.boot_id for r in drv.cp.claims.values()} == {None}
    held = host_state(node)
    assert drv.prepare(refs) == first and host_state(node) == held


def reboot(node, paths):
    """A cold boot: vGPUs, VFs, drivers and the tmpfs CDI specs gone; then the daemon's first
    resync enables the VFs of the ``dra`` layout again."""
    node.host.reboot()
    shutil.rmtree(paths.cdi_root)
    assert reconcile(node.env, node.io, DRA_LAYOUT, node=node.node).ok


def test_after_a_reboot_prepare_recreates_the_devices_first(node, paths, caplog):
    claims, pool, refs, first = prepared(node, paths)
    old = {d.device: d for r in make_driver(node, paths, claims, pool).cp.claims.values() for d in r.devices}
    boot = make_driver(node, paths, claims, pool).boot_id()
    reboot(node, paths)
    assert node.mdevs() == set()

    caplog.set_level(logging.INFO, logger=LOGGER)
    drv = make_driver(node, paths, claims, node.build_pool())  # the plugin starts again
    assert drv.boot_id() != boot
    assert drv.recover() == []
    out = drv.prepare(refs)
    assert all(a.error is None for a in out.values()), out
    for a in out.values():
        check_resolves(paths, a)  # nothing resolves to nothing

    recs = drv.cp.claims
    assert {r.boot_id for r in recs.values()} == {drv.boot_id()}
    new = {d.device: d for r in recs.values() for d in r.devices}
    for name, d in new.items():
        if d.framework == "mdev":  # the same vGPU UUID, on the host again
            assert d.vgpu_id == old[name].vgpu_id and d.vgpu_id in node.mdevs()
        elif d.framework == "vendor-vfio":
            assert node.current_vgpu_type(d.vgpu_id) == d.type_id
    assert node.driver_of(PT) == "vfio-pci"
    (meta,) = read_metadata_stream(paths.metadata_dir / "default_vm-vgpus" / "t4" / "metadata.json")
    (t4,) = [d for d in new.values() if d.request == "t4"]
    assert meta["requests"][0]["devices"][0]["attributes"] == {"mdevUUID": {"string": t4.vgpu_id}}
    assert any("earlier boot" in r.getMessage() for r in caplog.records)

    # idempotent again, and unprepare gives everything back
    assert drv.prepare(refs) == out
    assert drv.unprepare(refs) == {r.uid: None for r in refs}
    assert node.mdevs() == set() and node.driver_of(PT) == "nvidia"


def test_after_a_reboot_a_claim_that_cannot_be_recreated_gets_a_clear_error(node, paths):
    claims, pool, refs, first = prepared(node, paths)
    node.host.reboot()  # and the layout has not enabled the VFs again yet
    shutil.rmtree(paths.cdi_root)
    drv = make_driver(node, paths, claims, pool)
    res = drv.prepare([refs[0]])[UID_VGPUS]
    assert res.error and "vm-vgpus" in res.error and "earlier boot" in res.error, res.error
    assert res.devices == []
    assert node.mdevs() == set(), "the part that could be made was left behind"
    assert drv.cp.claims[UID_VGPUS].state == "prepared"  # kept, so the next prepare tries again
    assert reconcile(node.env, node.io, DRA_LAYOUT, node=node.node).ok
    again = drv.prepare([refs[0]])[UID_VGPUS]
    assert again.error is None
    check_resolves(paths, again)


def test_unprepare_of_a_claim_from_before_the_reboot_touches_no_device(node, paths):
    """Its ids may name another claim's device now: an L40S VF is known by its address."""
    claims, pool, refs, first = prepared(node, paths)
    old_vf = next(d.vgpu_id for d in make_driver(node, paths, claims, pool).cp.claims[UID_VGPUS].devices
                  if d.framework == "vendor-vfio")
    reboot(node, paths)
    pool = node.build_pool()
    newcomer = claims.add(claim_object("vm-new", [("l40s", devices_of(pool, L40S, "vgpu")[1])], node=node.node),
                          uid="6f1c1c2e-0000-4000-8000-00000000a003")
    drv = make_driver(node, paths, claims, pool)
    assert drv.prepare([newcomer])[newcomer.uid].error is None
    (v,) = node.gpu(L40S).vgpus
    assert v.parent != old_vf, "a new claim takes no VF a claim of an earlier boot still records (#29.3)"
    # something else (an admin, another tool) made a vGPU on the stale record's VF since the reboot
    node.io.write(node.env.pci(old_vf) / "nvidia/current_vgpu_type", v.type_id)
    assert drv.unprepare(refs) == {r.uid: None for r in refs}
    assert sorted(x.parent for x in node.gpu(L40S).vgpus) == sorted([old_vf, v.parent]), \
        "unprepare of a stale claim removed a device"
    assert set(drv.cp.claims) == {newcomer.uid}


def test_corrupted_checkpoint_after_a_reboot_still_recreates(node, paths):
    """The metadata files (kept across boots) name the claims; their devices are re-created on prepare."""
    claims, pool, refs, first = prepared(node, paths)
    paths.checkpoint.write_text("null")
    reboot(node, paths)
    drv = make_driver(node, paths, claims, node.build_pool())
    assert {r.boot_id for r in drv.cp.claims.values()} == {None}
    out = drv.prepare(refs)
    assert all(a.error is None for a in out.values()), out
    for a in out.values():
        check_resolves(paths, a)
    assert len(node.mdevs()) == 2


# --------------------------------------------------------------------------- hostile names


GOOD_UID = "6f1c1c2e-0000-4000-8000-00000000b001"


@pytest.mark.parametrize("field, namespace, name, uid", [
    ("namespace", "../../../../escape", "vm", GOOD_UID),
    ("namespace", "/tmp/escape", "vm", GOOD_UID),
    ("namespace", "a_b", "vm", GOOD_UID),
    ("name", "default", "../../../../escape", GOOD_UID),
    ("name", "default", "/tmp/escape", GOOD_UID),
    ("uid", "default", "vm", "../../../../../escape"),
    ("uid", "default", "vm", "/tmp/escape"),
    ("uid", "default", "vm", "not-a-uuid"),
    ("uid", "default", "vm", GOOD_UID.upper()),
])
def test_hostile_claim_identity_is_refused_before_anything_is_made(node, paths, tmp_path, field, namespace, name, uid):
    pool = node.build_pool()
    claims = DictClaims()
    obj = claim_object(name, [("vgpu", devices_of(pool, T4, "vgpu")[0])], node=node.node, namespace=namespace)
    ref = claims.add(obj, uid=uid)
    drv = make_driver(node, paths, claims, pool)
    before, mdevs = file_tree(tmp_path), node.mdevs()
    res = drv.prepare([ref])[uid]
    assert res.error and f"claim {field}" in res.error, res.error
    assert res.devices == []
    assert file_tree(tmp_path) == before, "a refused claim wrote something"
    assert node.mdevs() == mdevs, "a refused claim left a vGPU behind"
    assert uid not in drv.cp.claims
    assert drv.unprepare([ref]) == {uid: None}  # unknown: nothing to do, nothing touched
    assert file_tree(tmp_path) == before


@pytest.mark.parametrize("field, change", [
    ("request", lambda o: o["status"]["allocation"]["devices"]["results"][0].update(request="../../../../x")),
    ("request", lambda o: o["status"]["allocation"]["devices"]["results"][0].update(request="/tmp/x")),
    ("request", lambda o: o["status"]["allocation"]["devices"]["results"][0].update(request="a/b/../../c")),
    ("device", lambda o: o["status"]["allocation"]["devices"]["results"][0].update(device="../x")),
    ("pod-claim-name", lambda o: o["metadata"].setdefault("annotations", {}).update(
        {"resource.kubernetes.io/pod-claim-name": "../../../x"})),
])
def test_hostile_names_inside_the_claim_are_refused(node, paths, tmp_path, field, change):
    pool = node.build_pool()
    claims = DictClaims()
    obj = claim_object("vm", [("vgpu", devices_of(pool, T4, "vgpu")[0]), ("more", devices_of(pool, A100, "vgpu")[0])],
                       node=node.node)
    change(obj)
    ref = claims.add(obj, uid=GOOD_UID)
    drv = make_driver(node, paths, claims, pool)
    before = file_tree(tmp_path)
    res = drv.prepare([ref])[GOOD_UID]
    assert res.error and field in res.error and "vm" in res.error, res.error
    assert file_tree(tmp_path) == before and node.mdevs() == set()
    assert GOOD_UID not in drv.cp.claims


def test_a_symlink_out_of_the_metadata_dir_is_not_followed(node, paths, tmp_path):
    """Valid names, but the claim's metadata directory was replaced by a link elsewhere."""
    pool = node.build_pool()
    claims = DictClaims()
    ref = claims.add(claim_object("vm", [("vgpu", devices_of(pool, T4, "vgpu")[0])], node=node.node), uid=GOOD_UID)
    outside = tmp_path / "outside"
    outside.mkdir()
    paths.metadata_dir.mkdir(parents=True)
    (paths.metadata_dir / "default_vm").symlink_to(outside)
    res = make_driver(node, paths, claims, pool).prepare([ref])[GOOD_UID]
    assert res.error and "leaves" in res.error, res.error
    assert list(outside.iterdir()) == []
    assert node.mdevs() == set(), "the vGPU made before the refusal was left behind"


def test_files_a_checkpoint_names_outside_the_plugin_dirs_are_never_removed(node, paths, tmp_path):
    claims, pool, refs, first = prepared(node, paths)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    body = _resigned(paths.checkpoint.read_text(), lambda d: d["claims"][UID_PT].update(
        cdi_files=[str(victim)], metadata_files=[str(paths.cdi_root / ".." / ".." / ".." / ".." / "victim.txt")]))
    paths.checkpoint.write_text(body)
    drv = make_driver(node, paths, claims, pool)
    assert drv.unprepare([refs[1]]) == {UID_PT: None}
    assert victim.read_text() == "keep me"


def test_names_the_api_server_accepts_still_prepare(node, paths):
    """The checks refuse only what Kubernetes itself would: dotted names, long names, sub-requests."""
    pool = node.build_pool()
    claims = DictClaims()
    name = "vm.with-dots." + "x" * 200
    obj = claim_object(name, [("vgpu/small", devices_of(pool, T4, "vgpu")[0])], node=node.node, namespace="ns-1",
                       annotations={"resource.kubernetes.io/pod-claim-name": "gpu-claim"})
    ref = claims.add(obj, uid=GOOD_UID)
    res = make_driver(node, paths, claims, pool).prepare([ref])[GOOD_UID]
    assert res.error is None, res.error
    assert (paths.metadata_dir / f"ns-1_{name}" / "vgpu" / "metadata.json").exists()
    check_resolves(paths, res)


def test_refused_claims_do_not_stop_good_ones(node, paths):
    pool = node.build_pool()
    claims = DictClaims()
    t4 = devices_of(pool, T4, "vgpu")
    good = claims.add(claim_object("good", [("vgpu", t4[0])], node=node.node), uid=GOOD_UID)
    bad = ClaimRef(namespace="..", name="x", uid="6f1c1c2e-0000-4000-8000-00000000b002")
    out = make_driver(node, paths, claims, pool).prepare([bad, good])
    assert out[bad.uid].error and "namespace" in out[bad.uid].error
    assert out[GOOD_UID].error is None and len(node.mdevs()) == 1
