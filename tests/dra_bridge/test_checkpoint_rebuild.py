"""Issue 12: rebuilding a corrupted checkpoint: the API's claims allocated here, the layout's devices.

* a claim the files name gets its namespace, name and requests from its API object, and still
  holds its devices against a second claim;
* a claim allocated here whose files are all gone is recorded when the node shows something that
  can be it (a vGPU of its type on its GPU, its GPU on vfio-pci): held, never removed by the
  plugin; one the node shows nothing of is left to the kubelet's prepare;
* an API server that cannot be read does not stop the rebuild: it goes on from the node's files;
* at the daemon's start (no pool published yet) device names alone place a device.

Helpers are the checkpoint tests' (:mod:`tests.dra_bridge.test_checkpoint`).
"""

from __future__ import annotations

import logging
import shutil

import pytest

from dra_bridge.kubeletplugin import cdi, metadata, recovery
from dra_bridge.pool.devices import Pool
from dra_bridge.sim.apiserver import LocalApiServer
from tests.dra_bridge.test_checkpoint import (
    A100,
    L40S,
    LOGGER,
    PT,
    T4,
    check_resolves,
    host_state,
    norm,
    plugin_warnings,
    prepared,
)
from tests.support.dra import DRIVER, add_claim, devices_of, make_driver, read_metadata_stream


def api_prepared(node, paths, srv):
    """``prepared`` with the claims in the API server (server-assigned uids), read through ApiClaimSource."""
    pool = node.build_pool()
    vgpus = add_claim(srv, "vm-vgpus", [("t4", devices_of(pool, T4, "vgpu")[0]),
                                        ("l40s", devices_of(pool, L40S, "vgpu")[0])], node=node.node)
    whole = add_claim(srv, "vm-pt", [("gpu", devices_of(pool, PT, "passthrough")[0])], node=node.node,
                      namespace="tenant")
    drv = make_driver(node, paths, srv.api_client(), pool)
    answers = drv.prepare([vgpus, whole])
    assert all(a.error is None for a in answers.values()), answers
    return pool, [vgpus, whole], answers


def drop_files(paths, uid, *, claim_spec: bool):
    """A claim's metadata files and metadata CDI specs (and, with ``claim_spec``, its claim CDI spec)."""
    for f in list(paths.cdi_root.iterdir()):
        if metadata.parse_cdi_name(DRIVER, f.name) == uid or (claim_spec and cdi.parse_spec_name(DRIVER, f.name) == uid):
            f.unlink()
    for claim_dir in {m.parent.parent for m in paths.metadata_dir.rglob("metadata.json")
                      if read_metadata_stream(m)[0]["metadata"]["uid"] == uid}:
        shutil.rmtree(claim_dir)


def test_rebuild_takes_identity_and_requests_from_the_api(node, paths, srv, caplog):
    """Metadata files gone: the CDI spec names only the uid and device names; the API's claim gives
    back its namespace, name and requests, and it still holds its devices against a second claim."""
    pool, (vgpus, whole), first = api_prepared(node, paths, srv)
    held = host_state(node)
    drop_files(paths, vgpus.uid, claim_spec=False)
    paths.checkpoint.write_text("{")
    caplog.set_level(logging.INFO, logger=LOGGER)
    drv = make_driver(node, paths, srv.api_client(), pool)
    rec = drv.cp.claims[vgpus.uid]
    assert (rec.namespace, rec.name, rec.state) == ("default", "vm-vgpus", "prepared")
    assert sorted(d.request for d in rec.devices) == ["l40s", "t4"]
    assert {d.vgpu_id for d in rec.devices if d.framework == "mdev"} == held[0]
    (line,) = plugin_warnings(caplog)
    msg = line.getMessage()
    assert "recovered 2 prepared claims" in msg and "the API server's 2 claims allocated here" in msg, msg
    assert f"from the API server: uid {vgpus.uid} named default/vm-vgpus" in msg and "the request of 2 devices" in msg
    assert host_state(node) == held

    t4_dev = devices_of(pool, T4, "vgpu")[0]
    second = add_claim(srv, "vm-second", [("t4", t4_dev)], node=node.node)
    err = drv.prepare([second])[second.uid].error
    assert err and "default/vm-vgpus" in err and vgpus.uid in err and t4_dev in err, err
    assert host_state(node) == held
    assert drv.unprepare([vgpus, whole]) == {vgpus.uid: None, whole.uid: None}
    assert node.mdevs() == set() and host_state(node)[1] == {}


@pytest.mark.parametrize("published", ["pool", "daemon-start"])
def test_a_claim_allocated_here_without_files_holds_what_the_node_shows(node, paths, srv, caplog, published):
    """Every file of both claims gone: the API says they are allocated here and the node holds a
    vGPU of each allocated type and the GPU on vfio-pci, so they are recorded from the API; their
    devices count as in use and are refused to another claim. Which vGPU is the claim's cannot be
    told, so unprepare leaves it (and the passed-through GPU) on the node. At the daemon's start no
    pool is published yet: the GPU number in each device name places it."""
    pool, (vgpus, whole), first = api_prepared(node, paths, srv)
    held = host_state(node)
    for ref in (vgpus, whole):
        drop_files(paths, ref.uid, claim_spec=True)
    assert list(paths.cdi_root.iterdir()) == []
    paths.checkpoint.write_text("null")
    caplog.set_level(logging.INFO, logger=LOGGER)
    current = [pool if published == "pool" else Pool()]
    drv = make_driver(node, paths, srv.api_client(), lambda: current[0])
    current[0] = pool
    recs = drv.cp.claims
    assert set(recs) == {vgpus.uid, whole.uid}
    assert (recs[whole.uid].namespace, recs[whole.uid].name) == ("tenant", "vm-pt")
    assert {d.vgpu_id for d in recs[vgpus.uid].devices if d.framework == "mdev"} == held[0]
    assert {d.vgpu_id for d in recs[vgpus.uid].devices if d.framework == "vendor-vfio"} == set(held[1])
    assert all(d.parent is None for d in recs[vgpus.uid].devices), "a guessed vGPU must never be removed"
    assert [d.gpu for d in recs[whole.uid].devices] == [PT] and recs[whole.uid].devices[0].rebound == []
    assert {r.boot_id for r in recs.values()} == {None}
    msg = plugin_warnings(caplog)[0].getMessage()
    assert "default/vm-vgpus held without files" in msg and "tenant/vm-pt held without files" in msg, msg
    assert "default/vm-vgpus (2 devices, no files: held from its allocation)" in msg

    usage = drv.usage()  # what apply and the daemon's reconcile count as in use
    assert set(usage.mdevs) == held[0] and set(held[1]) | {PT} <= set(usage.pci)
    t4_dev = devices_of(pool, T4, "vgpu")[0]
    on_t4 = add_claim(srv, "vm-on-t4", [("t4", t4_dev)], node=node.node)
    on_pt = add_claim(srv, "vm-on-pt", [("v", devices_of(pool, PT, "vgpu")[0])], node=node.node)
    out = drv.prepare([on_t4, on_pt])
    assert "default/vm-vgpus" in out[on_t4.uid].error and "tenant/vm-pt" in out[on_pt.uid].error, out
    assert host_state(node) == held

    assert drv.unprepare([vgpus, whole]) == {vgpus.uid: None, whole.uid: None}
    assert host_state(node) == held and drv.cp.claims == {}


def test_a_claim_allocated_here_but_not_prepared_is_left_to_the_kubelet(node, paths, srv, caplog):
    """Allocated, never prepared: nothing on the node is its. It is not recorded (it would answer
    the kubelet with devices that do not exist); the log names it, and its prepare works as usual."""
    pool, refs, first = api_prepared(node, paths, srv)
    waiting = add_claim(srv, "vm-waiting", [("a100", devices_of(pool, A100, "vgpu")[0])], node=node.node)
    elsewhere = add_claim(srv, "vm-elsewhere", [("t4", devices_of(pool, T4, "vgpu")[1])], node="other-node")
    held = host_state(node)
    paths.checkpoint.write_text("[]")
    caplog.set_level(logging.INFO, logger=LOGGER)
    drv = make_driver(node, paths, srv.api_client(), pool)
    assert set(drv.cp.claims) == {r.uid for r in refs}
    msg = plugin_warnings(caplog)[0].getMessage()
    assert "allocated here but not prepared (the kubelet prepares them): default/vm-waiting" in msg, msg
    assert "vm-elsewhere" not in msg and "the API server's 3 claims allocated here" in msg
    assert host_state(node) == held
    res = drv.prepare([waiting])[waiting.uid]
    assert res.error is None, res.error
    check_resolves(paths, res)
    assert len(node.mdevs()) == len(held[0]) + 1
    assert elsewhere.uid not in drv.cp.claims


@pytest.mark.parametrize("fault", ["stopped", "503"])
def test_an_unreachable_api_server_does_not_stop_the_rebuild(node, paths, caplog, fault):
    """The API cannot be read: the rebuild goes on from the node's files, the plugin keeps serving
    its prepared claims, and the log line says the API server was not consulted and why."""
    from kubernetes.client import ApiClient

    srv = LocalApiServer(version="1.35").start()
    try:
        pool, refs, first = api_prepared(node, paths, srv)
        config = srv.client_configuration()
        if fault == "503":
            srv.inject("list", "resourceclaims", status=503, times=None)
    finally:
        if fault == "stopped":
            srv.stop()
    held = host_state(node)
    paths.checkpoint.write_text("{")
    caplog.set_level(logging.INFO, logger=LOGGER)
    try:
        drv = make_driver(node, paths, ApiClient(config), pool)
    finally:
        srv.stop()
    msg = plugin_warnings(caplog)[0].getMessage()
    assert "recovered 2 prepared claims" in msg and "not the API server: the API server could not be read" in msg, msg
    assert "default/vm-vgpus" in msg and "tenant/vm-pt" in msg
    assert ("HTTP 503" in msg) if fault == "503" else ("Connection refused" in msg or "Error" in msg), msg
    assert set(drv.cp.claims) == {r.uid for r in refs} and host_state(node) == held
    assert norm(drv.prepare(refs)) == norm(first)  # answered from the rebuilt records, no API needed


def test_device_names_place_a_device_without_the_pool(node):
    """At the daemon's start nothing is published yet: every published device's GPU, kind and type
    are read back from its name and the node (what the rebuild attributes API-only claims by)."""
    pool = node.build_pool()
    obs = recovery.Observed(inventory=node.inventory())
    assert pool.devices
    for d in pool.devices:
        # a size slot several types share: the type is the claim's choice, unknown from the name
        want = d.type_id if len(d.type_choices) <= 1 else None
        assert recovery._published(d.name, None, obs) == (d.kind, d.gpu, want), d.name


def test_a_source_that_cannot_list_claims_is_named(node, paths, caplog):
    claims, pool, refs, first = prepared(node, paths)
    paths.checkpoint.write_text("{")
    make_driver(node, paths, claims, pool)
    assert "not the API server: the claim source cannot list claims" in plugin_warnings(caplog)[0].getMessage()


def test_a_stale_file_does_not_give_a_layout_device_to_a_claim(node, paths, srv):
    """A claim's metadata outlives a reboot (it is under the kubelet root, not tmpfs); the VF its
    vendor-VFIO vGPU sat on may then carry a vGPU of the layout. A rebuild reading the old file must
    not take the layout's vGPU for the claim's: one device, one owner (found by the fault campaign)."""
    from mdev_manager import persist

    pool = node.build_pool()
    ref = add_claim(srv, "vm-l40s", [("gpu", devices_of(pool, L40S, "vgpu")[0])], node=node.node)
    drv = make_driver(node, paths, srv.api_client(), pool)
    assert drv.prepare([ref])[ref.uid].error is None
    (dev,) = drv.cp.claims[ref.uid].devices
    node.host.reboot()
    shutil.rmtree(paths.cdi_root, ignore_errors=True)  # tmpfs; the metadata files stay
    # the layout takes the VF back: a vGPU of the same type, recorded as the layout's
    node.host.write(node.env.pci(L40S) / "sriov_numvfs", "32")
    persist.save_vendor_vfio(node.env, node.io, {dev.vgpu_id: dev.type_id})
    node.io.write(node.env.pci(dev.vgpu_id) / "nvidia/current_vgpu_type", dev.type_id)
    assert node.vgpu_ids() == {dev.vgpu_id}
    paths.checkpoint.write_text("{")
    rebuilt = make_driver(node, paths, srv.api_client(), pool).cp.claims
    held = {d.vgpu_id for r in rebuilt.values() for d in r.devices}
    assert dev.vgpu_id not in held


def test_a_power_cut_after_an_unprepare_leaves_no_claim_for_a_rebuild_to_find(node, paths):
    """Issue 36 (the campaign, seed 1 with #36.5's steps): claim A on an L40S VF is unprepared and B
    prepared on the same VF; the power fails, B is re-prepared after the reboot, the checkpoint is
    corrupted and rebuilt from the files with no claim list to read. A's files must not come back with
    the page cache: a rebuild took its metadata for a prepared claim holding B's VF (one device, two
    claims). Fails without the ``io.sync()`` in ``Driver.unprepare``."""
    from mdev_manager.reconcile import reconcile
    from tests.dra_bridge.test_claim_recreated import PageCacheIO
    from tests.support.dra import DRA_LAYOUT, DictClaims, claim_object

    a_uid, b_uid = "6f1c1c2e-0000-4000-8000-00000000d001", "6f1c1c2e-0000-4000-8000-00000000d002"
    io = PageCacheIO(node.host)
    pool = node.build_pool()
    claims = DictClaims()
    dev = devices_of(pool, L40S, "vgpu")[0]
    a = claims.add(claim_object("vm-a", [("gpu", dev)], node=node.node), uid=a_uid)
    drv = make_driver(node, paths, claims, pool, io=io)
    assert drv.prepare([a])[a_uid].error is None
    io.sync()  # A's files long written back
    assert drv.unprepare([a]) == {a_uid: None}
    del claims.claims[(a.namespace, a.name)]  # deleted once unprepared
    b = claims.add(claim_object("vm-b", [("gpu", dev)], node=node.node), uid=b_uid)
    assert drv.prepare([b])[b_uid].error is None
    (vf,) = {d.vgpu_id for d in drv.cp.claims[b_uid].devices}
    io.power_loss()
    node.host.reboot()
    shutil.rmtree(paths.cdi_root)  # tmpfs
    assert reconcile(node.env, node.io, DRA_LAYOUT, node=node.node).ok
    drv = make_driver(node, paths, claims, node.build_pool(), io=io)
    drv.recover()
    assert drv.prepare([b])[b_uid].error is None  # the kubelet re-prepares B
    assert {d.vgpu_id for d in drv.cp.claims[b_uid].devices} == {vf}
    paths.checkpoint.write_text("{")
    rebuilt = make_driver(node, paths, claims, node.build_pool(), io=io).cp.claims
    owners = sorted(uid for uid, rec in rebuilt.items() if any(d.vgpu_id == vf for d in rec.devices))
    assert owners == [b_uid], owners
