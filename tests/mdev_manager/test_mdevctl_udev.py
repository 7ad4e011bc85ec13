"""mdevctl's udev rule on the simulated host (``mdevctl_udev``), and what it makes the node manager meet.

On a real host mdevctl's udev rule runs ``mdevctl start-parent-mdevs`` when a parent device appears
(a GPU bound to its driver at boot or at a rescan, VFs enabled): every ``start: auto`` definition
of that parent is made by mdevctl, beside whatever made the parent appear. An apply or a restore
that enables an A100's VFs can therefore find the saved vGPUs it is about to create already there:
the kernel answers its ``create`` with EEXIST (udev ran after its look, before its create), and the
vGPU asked for is adopted (issue 36's mutation (n)), not reported failed.
"""

from __future__ import annotations

import logging

from mdev_manager import catalog, persist
from mdev_manager.config import load_config
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore
from mdev_manager.sim.hostspec import load_host
from tests.support.simnodes import EXAMPLE_LAYOUT


def apply(sim, layouts):
    return reconcile(sim.env, sim.io, layouts)


def gpu_by_board(inv, key: str):
    b = catalog.board(key)
    return next(g for g in inv.gpus if (g.device_id, g.subsystem_device_id) == (b.device_id, b.subsystem_device_id))


def _udev_host(make_sim):
    return make_sim(load_host("default").model_copy(update={"mdevctl_udev": True}))


def test_a_parent_that_appears_has_its_auto_definitions_started(make_sim):
    sim = _udev_host(make_sim)
    assert apply(sim, load_config(EXAMPLE_LAYOUT)).ok
    inv = sim.discover()
    t4, a100 = gpu_by_board(inv, "T4"), gpu_by_board(inv, "A100-40GB")
    saved = {d.uuid: d for d in persist.load_definitions(sim.env, sim.io)[0]}
    on_t4 = {v.id for v in t4.vgpus}
    on_a100 = {v.id for v in a100.vgpus}
    assert on_t4 and on_a100 and on_t4 | on_a100 <= set(saved)
    manual = next(iter(on_a100))
    persist.save_definition(sim.env, sim.io, saved[manual].model_copy(update={"start": "manual"}))
    sim.host.reboot()  # at boot the T4's PF appears (the A100 has no VFs yet)
    sim.io.write(sim.env.pci(a100.address) / "sriov_numvfs", f"{a100.sriov_total_vfs}\n")
    assert sim.discover().all_vgpus() == []  # udev's workers have not run yet
    vf = sorted(vf.address for vf in sim.discover().gpu(a100.address).vfs)[-1]
    fresh = "11111111-1111-4111-8111-111111111111"
    sim.io.write(sim.env.pci(vf) / "mdev_supported_types" / saved[manual].mdev_type / "create", fresh + "\n")
    assert {v.id for v in sim.discover().all_vgpus()} == on_t4 | on_a100 - {manual} | {fresh}

def test_a_restore_that_enables_vfs_adopts_the_vgpus_mdevctl_made_meanwhile(make_sim, caplog):
    """The restore after a reboot enables the A100's VFs; mdevctl's udev rule makes their saved vGPUs
    before the restore's own creates, which meet EEXIST for the very vGPUs asked for: adopted."""
    sim = _udev_host(make_sim)
    assert apply(sim, load_config(EXAMPLE_LAYOUT)).ok
    before = sorted((v.parent, v.id, v.type_id) for v in sim.discover().all_vgpus())
    sim.host.reboot()
    with caplog.at_level(logging.INFO, logger="mdev_manager.executor"):
        reports = restore(sim.env, sim.io)
    assert reports and all(not r.failed for r in reports), [r.failed for r in reports]
    assert sorted((v.parent, v.id, v.type_id) for v in sim.discover().all_vgpus()) == before
    assert "exists already: adopted" in caplog.text
    out = apply(sim, load_config(EXAMPLE_LAYOUT))
    assert out.ok and [r for rnd in out.rounds for r in rnd.report.results] == []
