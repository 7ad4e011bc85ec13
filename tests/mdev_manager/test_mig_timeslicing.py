"""MIG time-slicing on GB20x (#38.3): several vGPUs of one type inside one GPU instance.

The RTX PRO 6000 Blackwell SE (GB202) supports it (PDB_PROP_GPU_MIG_TIMESLICING_SUPPORTED); B200
does not: there a MIG-backed vGPU takes its instance whole. Inside an instance the vGPUs sit at
the Blackwell rule's placements over the instance's GiB with the per-instance maximum
(../shared/reference/blackwell-vgpu.md §0, §1.4), so nothing over-allocates an instance.
"""

from __future__ import annotations

import pytest

from mdev_manager import persist
from mdev_manager.config import ConfigError
from mdev_manager.host.nvml import NVML_ERROR_IN_USE, Mig, NvmlError
from mdev_manager.plan import make_plan
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from tests.support.simnodes import layout

GPU = "0000:10:00.0"


def host(board: str) -> HostSpec:
    return HostSpec(name="h", node="h", gpus=[GpuGroup(board=board, vfs_enabled=True)])


def creatable(sim, vf: str) -> str:
    return sim.host.sys.joinpath("bus/pci/devices", vf, "nvidia/creatable_vgpu_types").read_text()


def set_type(sim, vf: str, num: int | str) -> None:
    sim.host.write(sim.env.pci(vf) / "nvidia/current_vgpu_type", f"{num}")


def test_several_vgpus_share_one_instance_up_to_its_maximum(make_sim):
    sim = make_sim(host("RTX-PRO-6000-BSE"))
    m = Mig(sim.io.nvml())
    m.set_mode(GPU, True)
    gi = m.create(GPU, 14, 0, 1)  # 1g.24gb at memory slice 0
    vfs = [vf.address for vf in sim.discover().gpu(GPU).vfs]
    assert "DC-1-6Q" in creatable(sim, vfs[0]) and "DC-2-12Q" not in creatable(sim, vfs[0])
    for vf in vfs[:4]:  # DC-1-6Q: 16 per GPU over 4 instances = 4 per instance
        set_type(sim, vf, 1553)
    g = sim.discover().gpu(GPU)
    assert sorted(v.placement_id for v in g.vgpus) == [0, 6, 12, 18]  # floor(24 j / 4)
    assert {v.gpu_instance for v in g.vgpus} == {gi}
    inst = next(i for i in g.mig.instances if i.id == gi)
    assert sorted(inst.vgpus) == sorted(vfs[:4]) and inst.vgpu in vfs[:4]
    assert "DC-1-6Q" not in creatable(sim, vfs[4]) and "DC-1-4Q" not in creatable(sim, vfs[4])  # full; one type each
    t = next(t for t in g.types if t.short_name == "DC-1-6Q")
    assert t.available_instances == 0 and t.max_per_instance == 4
    with pytest.raises(OSError):
        set_type(sim, vfs[4], 1553)
    with pytest.raises(NvmlError) as e:
        m.destroy(GPU, gi)
    assert e.value.code == NVML_ERROR_IN_USE
    set_type(sim, vfs[1], 0)  # one leaves: its placement is free again, the instance still in use
    assert "DC-1-6Q" in creatable(sim, vfs[4])
    set_type(sim, vfs[4], 1553)
    assert sorted(v.placement_id for v in sim.discover().gpu(GPU).vgpus) == [0, 6, 12, 18]
    for vf in (vfs[0], vfs[2], vfs[3], vfs[4]):
        set_type(sim, vf, 0)
    assert "DC-1-4Q" in creatable(sim, vfs[0])  # empty: any type of the profile again
    m.destroy(GPU, gi)


def test_gb100_boards_keep_one_vgpu_per_instance(make_sim):
    sim = make_sim(host("B200"))
    m = Mig(sim.io.nvml())
    m.set_mode(GPU, True)
    gi = m.create(GPU, 19, 0, 1)  # 1g.23gb
    vfs = [vf.address for vf in sim.discover().gpu(GPU).vfs]
    set_type(sim, vfs[0], 2152)
    assert "B200X-1-23C" not in creatable(sim, vfs[1])
    g = sim.discover().gpu(GPU)
    assert g.vgpus[0].gpu_instance == gi and g.vgpus[0].placement_id is None
    assert next(t for t in g.types if t.short_name == "B200X-1-23C").max_per_instance is None


# --------------------------------------------------------------------------- the node manager

def _shape(sim) -> list[tuple[str, int, int, list[str]]]:
    """(profile, start, size, short types of its vGPUs) of each GPU instance."""
    g = sim.discover().gpu(GPU)
    names = {v.id: v.type_name.split()[-1] for v in g.vgpus}
    return sorted((g.mig.profile(i.profile_id).name, i.placement.start, i.placement.size,
                   sorted(names[v] for v in i.vgpus)) for i in g.mig.instances)


SHARED = {"DC-1-6Q": 8, "DC-2-24Q": 2}  # 2 x 1g.24gb with 4 each, 1 x 2g.48gb with 2: all 4 memory slices


def test_a_layout_puts_several_vgpus_in_each_instance_and_then_changes_nothing(make_sim):
    sim = make_sim(host("RTX-PRO-6000-BSE"))
    out = reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": SHARED}), read_back=True)
    assert out.matches, out.rounds[-1].plan.skipped
    assert _shape(sim) == [("1g.24gb", 2, 1, ["DC-1-6Q"] * 4), ("1g.24gb", 3, 1, ["DC-1-6Q"] * 4),
                           ("2g.48gb", 0, 2, ["DC-2-24Q"] * 2)]  # widest first
    for i in sim.discover().gpu(GPU).mig.instances:  # the Blackwell rule inside each instance
        placed = sorted(v.placement_id for v in sim.discover().gpu(GPU).vgpus if v.gpu_instance == i.id)
        assert placed in ([0, 6, 12, 18], [0, 24])
    assert reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": SHARED})).changed == 0
    saved = persist.load_mig(sim.env, sim.io)[GPU]
    assert sorted(len(e.get("vgpus") or [e["vgpu"]]) for e in saved) == [2, 4, 4]


def test_fewer_then_more_vgpus_reuse_the_shared_instances(make_sim):
    sim = make_sim(host("RTX-PRO-6000-BSE"))
    assert reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": {"DC-1-6Q": 5}})).matches
    assert _shape(sim) == [("1g.24gb", 0, 1, ["DC-1-6Q"] * 4), ("1g.24gb", 1, 1, ["DC-1-6Q"])]
    assert reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": {"DC-1-6Q": 7}})).matches
    assert _shape(sim) == [("1g.24gb", 0, 1, ["DC-1-6Q"] * 4), ("1g.24gb", 1, 1, ["DC-1-6Q"] * 3)]


def test_more_than_the_instances_hold_is_refused_before_any_step(make_sim):
    sim = make_sim(host("RTX-PRO-6000-BSE"))
    reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": {"DC-1-6Q": 1}}))  # MIG mode on
    with pytest.raises(ConfigError, match="do not fit"):
        make_plan(sim.discover(), layout({"index": 0, "vgpus": {"DC-1-6Q": 12, "DC-2-24Q": 3}}))


def test_a_reboot_is_restored_with_every_vgpu_on_its_instance(make_sim):
    sim = make_sim(host("RTX-PRO-6000-BSE"))
    reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": SHARED}))
    before = _shape(sim)
    sim.host.reboot()
    assert not sim.discover().gpu(GPU).vgpus
    reports = restore(sim.env, sim.io)
    assert all(r.ok for rep in reports for r in rep.results), [r for rep in reports for r in rep.results if not r.ok]
    assert _shape(sim) == before
    assert reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": SHARED})).changed == 0


def test_b200_takes_one_instance_per_vgpu(make_sim):
    sim = make_sim(host("B200"))
    assert reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": {"B200X-3-90C": 1, "B200X-1-23C": 3}})).matches
    assert _shape(sim) == [("1g.23gb", 4, 1, ["B200X-1-23C"]), ("1g.23gb", 5, 1, ["B200X-1-23C"]),
                           ("1g.23gb", 6, 1, ["B200X-1-23C"]), ("3g.90gb", 0, 4, ["B200X-3-90C"])]



def test_the_record_of_a_shared_instance_round_trips_and_a_corrupt_one_is_skipped(make_sim):
    sim = make_sim(host("RTX-PRO-6000-BSE"))
    entry = {"profile": 14, "start": 0, "size": 1, "vgpu": "0000:10:00.4", "vgpus": ["0000:10:00.4", "0000:10:00.5"]}
    persist.save_mig(sim.env, sim.io, {GPU: [entry]})
    assert persist.load_mig(sim.env, sim.io) == {GPU: [entry]}
    text = sim.env.mig_state.read_text().replace('"0000:10:00.5"', '"../../etc"')
    sim.env.mig_state.write_text(text)
    assert persist.load_mig(sim.env, sim.io) == {}  # a path in it: the GPU's entries are skipped, not used
