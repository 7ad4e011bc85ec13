"""``restore`` after a reboot brings back what a layout set up, in the layout's order.

A reboot returns passed-through GPUs to their native driver, turns VFs off and drops every
vGPU (``SimHost.reboot``). restore binds the saved passthrough functions to vfio-pci and
enables VFs first, then re-creates the vGPUs, and never rebinds a GPU something uses.
"""

from __future__ import annotations

import errno

import pytest

from mdev_manager import persist
from mdev_manager.actions import BindDriver, CreateMdev, EnableVfs, SetVgpuType
from mdev_manager.config import load_config
from mdev_manager.models import Usage
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import plan_restore, restore
from mdev_manager.sim import HostSpec, SimIO
from mdev_manager.sim.hostspec import GpuGroup
from tests.support.simnodes import EXAMPLE_LAYOUT, Sim, layout

PASSED = "0000:13:00.0"  # the second T4, passthrough in examples/layout.yaml


class OrderIO(SimIO):
    """Records the order of the writes that matter here: saved state and driver attributes."""

    def __init__(self, host, fail: str | None = None):
        super().__init__(host)
        self.log: list[str] = []
        self.fail = fail

    def write(self, path, data):
        self.log.append(f"{path.name} {str(data).strip()}")
        if self.fail and path.name == self.fail:
            raise OSError(errno.EIO, "injected")
        super().write(path, data)

    def write_atomic(self, path, data, **kw):
        self.log.append(f"save {path.name}")
        super().write_atomic(path, data, **kw)


def snapshot(sim: Sim) -> dict:
    inv = sim.discover()
    return {"drivers": {g.address: sorted(g.iommu_group_drivers.items()) for g in inv.gpus},
            "vfs": {g.address: g.sriov_num_vfs for g in inv.gpus},
            "vgpus": sorted((v.parent, v.id, v.type_id) for v in inv.all_vgpus())}


@pytest.fixture
def applied(sim) -> Sim:
    assert reconcile(sim.env, sim.io, load_config(EXAMPLE_LAYOUT)).ok
    return sim


def test_apply_saves_the_passthrough_binding(applied):
    assert persist.load_passthrough(applied.env, applied.io) == {PASSED: PASSED}


def test_restore_after_reboot_brings_back_passthrough_vfs_and_vgpus(applied):
    before = snapshot(applied)
    applied.host.reboot()
    gone = applied.discover()
    assert gone.gpu(PASSED).driver == "nvidia" and gone.all_vgpus() == []

    reports = restore(applied.env, applied.io)
    assert reports and all(not r.failed for r in reports)
    # the layout's order: bindings and VFs in the first round, vGPUs after rediscovery
    first = [r.step for r in reports[0].results]
    assert first[0] == f"bind {PASSED} to vfio-pci"
    assert all(s.startswith(("bind ", "enable ")) for s in first) and any(s.startswith("enable ") for s in first)
    assert not any(s.startswith("bind ") for r in reports[1:] for s in (x.step for x in r.results))
    assert snapshot(applied) == before
    assert applied.discover().gpu(PASSED).driver == "vfio-pci"
    # idempotent, and the layout finds nothing left to do
    assert restore(applied.env, applied.io) == []
    out = reconcile(applied.env, applied.io, load_config(EXAMPLE_LAYOUT))
    assert out.ok and out.changed == 0


def test_every_function_of_the_group_goes_back(make_sim):
    sim = make_sim(HostSpec(gpus=[GpuGroup(board="T4"), GpuGroup(board="T4", audio_function=True)]))
    gpu = sim.discover().gpus[1]
    audio = gpu.address[:-1] + "1"
    assert reconcile(sim.env, sim.io, layout({"index": 0, "vgpus": {"T4-4Q": 2}},
                                             {"index": 1, "mode": "passthrough"})).ok
    assert persist.load_passthrough(sim.env, sim.io) == {gpu.address: gpu.address, audio: gpu.address}
    before = snapshot(sim)
    sim.host.reboot()
    assert dict(snapshot(sim)["drivers"][gpu.address])[audio] == "snd_hda_intel"
    restore(sim.env, sim.io)
    assert snapshot(sim) == before
    assert dict(snapshot(sim)["drivers"][gpu.address]) == {gpu.address: "vfio-pci", audio: "vfio-pci"}


def test_the_binding_is_saved_before_the_device_changes(sim):
    """Crash safety by ordering: a bind that fails (or a crash) after the save leaves a record
    that restore completes; the record never lags behind the device."""
    io = OrderIO(sim.host, fail="drivers_probe")
    out = reconcile(sim.env, io, layout({"index": 1, "mode": "passthrough"}))
    assert not out.ok
    assert io.log.index("save passthrough.json") < io.log.index("driver_override vfio-pci")
    assert persist.load_passthrough(sim.env, sim.io) == {PASSED: PASSED}
    assert sim.discover().gpu(PASSED).driver is None  # unbound, probe failed
    restore(sim.env, sim.io)
    assert sim.discover().gpu(PASSED).driver == "vfio-pci"


def test_back_to_vgpus_forgets_the_binding(applied):
    doc = layout({"index": 1, "vgpus": {"T4-4Q": 2}})
    io = OrderIO(applied.host)
    assert reconcile(applied.env, io, doc).ok
    assert persist.load_passthrough(applied.env, applied.io) == {}
    # forgotten only once the function is back on its native driver
    assert io.log.index(f"drivers_probe {PASSED}") < io.log.index("save passthrough.json")
    before = snapshot(applied)
    applied.host.reboot()
    restore(applied.env, applied.io)
    assert snapshot(applied) == before and applied.discover().gpu(PASSED).driver == "nvidia"


def test_restore_never_rebinds_a_gpu_a_claim_holds(applied):
    applied.host.reboot()
    claim = Usage(pci={PASSED: ["ResourceClaim default/vm1-gpu"]})
    reports = restore(applied.env, applied.io, claim)
    assert all(not r.failed for r in reports)
    assert applied.discover().gpu(PASSED).driver == "nvidia"
    inv = applied.discover()
    plan = plan_restore(inv, applied.definitions(), applied.records(), claim,
                        persist.load_passthrough(applied.env, applied.io))
    assert plan.actions == []
    assert any(PASSED in n and "ResourceClaim default/vm1-gpu" in n for n in plan.notes)


def test_restore_never_rebinds_a_gpu_holding_vgpus(applied, holder):
    """After a crash (no reboot) the GPU went back to its driver and got a vGPU someone uses."""
    sim = applied
    sim.io.write(sim.env.pci(PASSED) / "driver_override", "\n")
    sim.io.write(sim.env.pci_drivers / "vfio-pci" / "unbind", PASSED)
    sim.io.write(sim.env.drivers_probe, PASSED)
    t = next(t for t in sim.discover().gpu(PASSED).types if t.short_name == "T4-4Q")
    uuid = "99999999-9999-4999-8999-999999999999"
    sim.io.write(sim.env.pci(PASSED) / "mdev_supported_types" / t.id / "create", uuid + "\n")
    vgpu = sim.discover().gpu(PASSED).vgpus[0]
    h = holder(sim, sim.env.vfio_group(vgpu.iommu_group))
    view = h.view(sim)
    reports = restore(view.env, view.io)
    assert all(not r.failed for r in reports)
    after = sim.discover().gpu(PASSED)
    assert after.driver == "nvidia" and [v.id for v in after.vgpus] == [uuid]


def test_saved_vgpus_win_over_a_stale_binding(applied):
    """A layout passing a GPU through forgets its vGPUs first: a GPU with both saved is one a
    newer layout (or an admin) gave vGPUs again, and restore brings the vGPUs back."""
    t4 = applied.discover().gpus[0].address
    persist.save_passthrough(applied.env, applied.io, {PASSED: PASSED, t4: t4})
    before = snapshot(applied)
    applied.host.reboot()
    inv = applied.discover()
    plan = plan_restore(inv, applied.definitions(), applied.records(), None,
                        persist.load_passthrough(applied.env, applied.io))
    binds = [a for a in plan.actions if isinstance(a, BindDriver)]
    assert [(a.address, a.driver) for a in binds] == [(PASSED, "vfio-pci")]
    assert any(t4 in n and "saved vGPUs" in n for n in plan.notes)
    restore(applied.env, applied.io)
    assert snapshot(applied) == before


def test_no_vfs_or_vgpus_on_a_saved_passthrough_gpu(applied):
    """Stale saved vGPUs on a VF of a passed-through SR-IOV GPU do not turn its VFs on."""
    inv = applied.discover()
    a100 = next(g for g in inv.gpus if "A100" in g.model)
    applied.host.reboot()
    # the A100 was passed through by an earlier layout and its saved vGPUs kept (hand-made state)
    persist.save_passthrough(applied.env, applied.io, {PASSED: PASSED, a100.address: a100.address})
    plan = plan_restore(applied.discover(), applied.definitions(), applied.records(), None,
                        persist.load_passthrough(applied.env, applied.io))
    enabled = {a.gpu for a in plan.actions if isinstance(a, EnableVfs)}
    assert a100.address in enabled  # saved vGPUs win: the A100 is not rebound
    assert not [a for a in plan.actions if isinstance(a, (CreateMdev, SetVgpuType))]  # structural first
    for d in applied.definitions():  # without them the saved binding stands
        if d.parent.rsplit(":", 1)[0] == a100.address.rsplit(":", 1)[0]:
            persist.remove_definition(applied.env, applied.io, d.parent, d.uuid)
    persist.save_passthrough(applied.env, applied.io, {PASSED: PASSED, a100.address: a100.address})
    plan = plan_restore(applied.discover(), applied.definitions(), applied.records(), None,
                        persist.load_passthrough(applied.env, applied.io))
    assert a100.address not in {a.gpu for a in plan.actions if isinstance(a, EnableVfs)}
    assert (a100.address, "vfio-pci") in {(a.address, a.driver) for a in plan.actions if isinstance(a, BindDriver)}


def test_a_gpu_already_on_vfio_pci_is_recorded_and_unmanaged_forgets_it(sim):
    """A GPU bound to vfio-pci by hand (or by an older vgpuctl) gets no bind step: apply records
    it all the same, so restore brings it back after a reboot; a layout that hands the GPU back
    (unmanaged) forgets it, so no stale record rebinds it later."""
    from mdev_manager.executor import Executor

    Executor(sim.env, sim.io).bind(PASSED, "vfio-pci")
    doc = {"version": "vgpuctl/v1", "layouts": {"default": [{"pciAddress": PASSED, "mode": "passthrough"}],
                                                "off": [{"pciAddress": PASSED, "mode": "unmanaged"}]}}
    out = reconcile(sim.env, sim.io, layout(*doc["layouts"]["default"]))
    assert out.ok and [r.step for rnd in out.rounds for r in rnd.report.results] == [
        f"persist {PASSED} as passed through"]
    assert persist.load_passthrough(sim.env, sim.io) == {PASSED: PASSED}
    sim.host.reboot()
    restore(sim.env, sim.io)
    assert sim.discover().gpu(PASSED).driver == "vfio-pci"
    assert reconcile(sim.env, sim.io, layout(*doc["layouts"]["off"])).ok
    assert persist.load_passthrough(sim.env, sim.io) == {}
    assert sim.discover().gpu(PASSED).driver == "vfio-pci"  # unmanaged: left as it is
