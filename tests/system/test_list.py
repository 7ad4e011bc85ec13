"""Per-vGPU operations as mdevctl users expect (issue #26, point 3): ``vgpuctl list`` shows the active
vGPUs and, with ``--defined``, the persisted ones (as ``mdevctl list [--defined]``), with their
holders (a process holding the vGPU's /dev/vfio group, a prepared DRA claim); ``apply --gpu`` re-lays
out one GPU and leaves every other GPU exactly as it was, its vGPUs in use or not."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from dra_bridge.api.nodepaths import NodePaths
from mdev_manager import persist
from mdev_manager.discovery import discover
from mdev_manager.sim.node import sim_node
from tests.support.dra import DictClaims, claim_object, devices_of, make_driver, make_node
from vgpuctl.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "layout.yaml"
A100 = "0000:16:00.0"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def applied_host(tmp_path: Path, capsys):
    """The default simulated host with examples/layout.yaml applied (T4 0: 8 x T4-2Q, T4 1 passed
    through, A100: 6 x A100-4C on VFs, L40S: 4 x L40S-8Q vendor-VFIO)."""
    root = tmp_path / "host"
    sim = ["--simulate", "default", "--sim-dir", str(root)]
    assert run(capsys, *sim, "apply", "-f", str(EXAMPLE))[0] == 0
    return sim_node(root, "default", reuse=True), sim


def test_list_shows_active_then_defined_vgpus_and_the_process_holding_one(tmp_path, capsys):
    node, sim = applied_host(tmp_path, capsys)
    inv = discover(node.env, node.io)
    held = next(v for v in inv.all_vgpus() if v.framework == "mdev")
    pid = node.host.spawn_holder([node.env.vfio_group(held.iommu_group)], comm="qemu-kvm")

    code, out, _ = run(capsys, *sim, "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["GPU", "VGPU", "TYPE", "STATE", "HOLDERS"]
    assert all(len(line) <= 80 for line in lines)
    assert len([line for line in lines if not line.startswith(" ")]) == 1 + len(inv.all_vgpus())
    (row,) = [line for line in lines if held.id in line]
    assert row.split()[2:] == ["T4-2Q", "active+def", f"qemu-kvm[{pid}]"]
    assert any(line.split()[1] == "0000:19:00.4" and "L40S-8Q" in line for line in lines)  # vendor-VFIO: the VF
    data = json.loads(run(capsys, *sim, "list", "--gpu", "0", "-o", "json")[1])
    assert {r["gpu"] for r in data} == {"0000:10:00.0"} and len(data) == 8
    assert all(r["active"] and r["defined"] and r["start"] == "auto" for r in data)
    assert next(r for r in data if r["id"] == held.id)["holders"] == [f"qemu-kvm[{pid}]"]

    node.host.kill(pid)
    assert run(capsys, *sim, "sim", "reboot")[0] == 0  # vGPUs gone, their definitions stay
    code, out, _ = run(capsys, *sim, "list")
    assert code == 0 and out.startswith("no active vGPUs")
    code, out, _ = run(capsys, *sim, "list", "--defined", "-o", "wide")
    assert held.id in out and "defined" in out and "active" not in out
    assert out.count("\n") == 1 + len(inv.all_vgpus())
    assert yaml.safe_load(run(capsys, *sim, "list", "-d", "-u", held.id, "-o", "yaml")[1])[0]["id"] == held.id


def test_list_names_the_dra_claim_a_prepared_vgpu_serves(tmp_path, capsys):
    node = make_node(tmp_path)
    paths = NodePaths(kubelet_root=node.root / "kubelet", cdi_root=tmp_path / "cdi")
    pool = node.build_pool()
    claims = DictClaims()
    uid = "6f1c1c2e-0000-4000-8000-00000000c026"
    ref = claims.add(claim_object("vm1-gpu", [("gpu", devices_of(pool, "0000:10:00.0", "vgpu")[0])], node=node.node,
                                  namespace="vms"), uid)
    drv = make_driver(node, paths, claims, pool)
    assert drv.prepare([ref])[uid].error is None
    (vgpu,) = [d.vgpu_id for d in drv.cp.claims[uid].devices]
    code, out, _ = run(capsys, "--simulate", "--sim-dir", str(node.root), "list")
    (row,) = [line for line in out.splitlines() if vgpu in line]
    assert code == 0 and row.split()[-2:] == ["claim", "vms/vm1-gpu"] and "active " in row  # not persisted


def snapshot(node, gpus: set[str]) -> dict:
    """Everything of ``gpus`` a re-layout could change: driver, VFs, vGPUs, definitions, records."""
    inv = discover(node.env, node.io)
    mine = {g.address: g for g in inv.gpus if g.address in gpus}
    parents = {p.address for g in mine.values() for p in g.parents} | set(mine)
    vfs = {v.address for g in mine.values() for v in g.vfs}
    definitions, _ = persist.load_definitions(node.env, node.io)
    files = {str(p): p.read_text() for p in Path(node.env.mdevctl_root).rglob("*") if p.is_file()
             and p.parent.name in parents}
    return {"gpus": {a: (g.driver, g.sriov_num_vfs, sorted((v.id, v.type_id, v.parent) for v in g.vgpus),
                         g.iommu_group_drivers) for a, g in mine.items()},
            "definitions": sorted((d.uuid, d.parent, d.mdev_type, d.start) for d in definitions if d.parent in parents),
            "definition files": files,
            "vendor records": {vf: t for vf, t in persist.load_vendor_vfio(node.env, node.io).items() if vf in vfs},
            "passthrough": {f: g for f, g in persist.load_passthrough(node.env, node.io).items() if g in gpus}}


def test_apply_gpu_relayouts_that_gpu_alone_and_leaves_the_others_as_they_were_in_use_or_not(tmp_path, capsys):
    node, sim = applied_host(tmp_path, capsys)
    inv = discover(node.env, node.io)
    others = {g.address for g in inv.gpus} - {A100}
    for g in inv.gpus:  # a VM on one vGPU of each other GPU that has vGPUs
        if g.address != A100 and g.vgpus:
            node.host.spawn_holder([node.env.vfio_group(g.vgpus[0].iommu_group)])
    before = snapshot(node, others)
    relayout = tmp_path / "relayout.yaml"  # every GPU differs from what it holds
    relayout.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"index": 0, "mode": "vgpu", "vgpus": {"T4-4Q": 4}}, {"index": 1, "mode": "vgpu", "vgpus": {"T4-8Q": 2}},
        {"model": "A100", "mode": "vgpu", "vgpus": {"A100-8C": 3}},
        {"pciAddress": "0000:19:00.0", "mode": "vgpu", "vgpus": {"NVIDIA L40S-12Q": 2}}]}}))
    code, out, _ = run(capsys, *sim, "plan", "-f", str(relayout))
    assert "T4-4Q" in out and "L40S-12Q" in out  # the whole layout would change the others

    code, out, err = run(capsys, *sim, "apply", "-f", str(relayout), "--gpu", A100)
    assert code == 0, out + err
    assert "node matches the layout" in out.splitlines()[-1]
    assert sorted(v.type_name for v in discover(node.env, node.io).gpu(A100).vgpus) == ["NVIDIA A100-8C"] * 3
    assert snapshot(node, others) == before
    code, out, _ = run(capsys, *sim, "plan", "-f", str(relayout), "--gpu", "2")
    assert code == 0 and "nothing to change" in out.splitlines()[-1]
    code, _, err = run(capsys, *sim, "apply", "-f", str(relayout), "--gpu", "7")
    assert code == 2 and "no such GPU on this node; its GPUs: 0 (0000:10:00.0)" in err
    assert snapshot(node, others) == before
