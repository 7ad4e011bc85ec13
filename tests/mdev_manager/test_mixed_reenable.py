"""Mixed-size mode after the GPU's VFs are enabled again (issue #33, point 4).

NVIDIA's tooling clears heterogeneous (mixed-size) mode whenever VFs are enabled or disabled
(``sriov-manage -e/-d``): set before the VFs exist, it reads back enabled and is wiped by the
rebind, every VF then collapsing to one size (../shared/reference/heterogeneous-vgpu.md, "Order of
operations on SR-IOV boards"). The simulated host does the same; the node manager enables the VFs,
then sets the mode, then creates and places the vGPUs, and after any re-enable it sets the mode
again and puts every vGPU back at its recorded placement (apply and restore alike).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mdev_manager import persist
from mdev_manager.config import parse_config
from mdev_manager.host.nvml import VgpuModes
from mdev_manager.models import Usage
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore
from tests.support.dra import make_node
from vgpuctl.main import main

L40S, A100 = "0000:19:00.0", "0000:16:00.0"  # the default preset's vendor-VFIO and mdev-on-VF GPUs
# layouts applied in turn: the last one's placements are not those a fresh search of it would choose
STEPS = {
    L40S: [{"L40S-16Q": 1}, {"L40S-16Q": 1, "L40S-8Q": 2}, {"L40S-8Q": 2}, {"L40S-8Q": 2, "L40S-4Q": 1}],
    A100: [{"A100-10C": 1}, {"A100-10C": 1, "A100-5C": 2}, {"A100-5C": 2}, {"A100-5C": 2, "A100-4C": 1}],
}


def _doc(gpu: str, vgpus: dict) -> dict:
    return {"version": "vgpuctl/v1", "layouts": {"default": [
        {"pciAddress": gpu, "mode": "vgpu", "mixedSize": True, "vgpus": vgpus}]}}


def _placed(node, gpu: str) -> dict[str, tuple[str, int]]:
    return {v.id: (v.type_id, v.placement_id) for v in node.inventory().gpu(gpu).vgpus}


def _numvfs(node, gpu: str, n: int) -> None:
    node.io.write(node.env.pci(gpu) / "sriov_numvfs", f"{n}\n")  # sriov-manage -d / -e, behind vgpuctl's back


def _laid_out(tmp_path: Path, gpu: str):
    node = make_node(tmp_path, prepare_gpus=False)
    for vgpus in STEPS[gpu]:
        out = reconcile(node.env, node.io, parse_config(_doc(gpu, vgpus), "default"), read_back=True)
        assert out.ok, out
    before = _placed(node, gpu)
    assert node.inventory().gpu(gpu).mixed_size and len({t for t, _ in before.values()}) > 1
    assert persist.load_placements(node.env, node.io)[gpu]["vgpus"] == {k: p for k, (_, p) in before.items()}
    return node, before


@pytest.mark.parametrize("gpu", [L40S, A100])
def test_apply_after_vfs_were_enabled_again_sets_the_mode_then_places_them_back(tmp_path, gpu):
    node, before = _laid_out(tmp_path, gpu)
    total = node.inventory().gpu(gpu).sriov_total_vfs
    _numvfs(node, gpu, 0)
    _numvfs(node, gpu, total)
    g = node.inventory().gpu(gpu)
    assert not g.mixed_size and g.vgpus == []  # the re-enable cleared the mode and every vGPU
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps(_doc(gpu, STEPS[gpu][-1])))
    assert main(["--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout)]) == 0
    assert node.inventory().gpu(gpu).mixed_size
    assert _placed(node, gpu) == before  # the same vGPUs at the same placements
    assert persist.load_placements(node.env, node.io)[gpu]["vgpus"] == {k: p for k, (_, p) in before.items()}


@pytest.mark.parametrize("gpu", [L40S, A100])
def test_apply_enables_the_vfs_first_and_sets_the_mode_after_them(tmp_path, capsys, gpu):
    """VFs left disabled: the apply enables them in one round, sets the mode in the next (never before
    the VFs exist, where the rebind would wipe it), then creates and places the vGPUs."""
    node, before = _laid_out(tmp_path, gpu)
    _numvfs(node, gpu, 0)
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps(_doc(gpu, STEPS[gpu][-1])))
    assert main(["--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    kinds = [[a["kind"] for a in r["plan"]["actions"]] for r in doc["rounds"]]
    enable = next(i for i, k in enumerate(kinds) if "enable_vfs" in k)
    mode = next(i for i, k in enumerate(kinds) if "set_mixed_size" in k)
    place = next(i for i, k in enumerate(kinds) if "set_placement" in k)
    assert enable < mode < place, kinds
    assert _placed(node, gpu) == before and node.inventory().gpu(gpu).mixed_size


@pytest.mark.parametrize("gpu", [L40S, A100])
def test_restore_after_vfs_were_enabled_again_brings_mode_and_placements_back(tmp_path, gpu):
    node, before = _laid_out(tmp_path, gpu)
    total = node.inventory().gpu(gpu).sriov_total_vfs
    _numvfs(node, gpu, 0)
    _numvfs(node, gpu, total)
    reports = restore(node.env, node.io, Usage())
    assert all(not r.failed for r in reports)
    assert node.inventory().gpu(gpu).mixed_size and _placed(node, gpu) == before


def test_the_simulated_driver_wipes_a_mode_set_before_the_vfs(tmp_path):
    """Set on the PF while its VFs are off, the mode reads back enabled; enabling the VFs clears it
    and the VFs are then of one size (equal-size mode), as measured on real boards."""
    node = make_node(tmp_path, prepare_gpus=False)
    modes = VgpuModes(node.io.nvml())
    assert node.inventory().gpu(L40S).sriov_num_vfs == 0
    modes.set_mode(L40S, True)
    assert node.inventory().gpu(L40S).mixed_size
    _numvfs(node, L40S, node.inventory().gpu(L40S).sriov_total_vfs)
    g = node.inventory().gpu(L40S)
    assert not g.mixed_size
    vf = g.vfs[0].address
    node.io.write(node.env.pci(vf) / "nvidia/current_vgpu_type", "1152\n")  # L40S-8Q
    other = node.inventory().gpu(L40S).vfs[1].address
    creatable = (node.env.pci(other) / "nvidia/creatable_vgpu_types").read_text()
    sizes = {line.split()[-1] for line in creatable.splitlines()[1:] if line.strip()}
    assert sizes and all(re.search(r"-8[A-Z]$", s) for s in sizes), creatable  # one size: the first's 8 GiB
