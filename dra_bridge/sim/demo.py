"""``vgpuctl demo``: the whole system on a simulated cluster, in seconds, with nothing to install.

One simulated node from the catalog (two Tesla T4 with mdev, an A100 with mdev on SR-IOV VFs in MIG
mode, an L40S with NVIDIA vendor-specific VFIO), the node manager applying the demo layout, the DRA bridge
publishing ResourceSlices to an in-process API server, and a set of workloads as real objects:
VirtualMachines asking for vGPUs of two profiles through ResourceClaimTemplates, a VM with a whole
GPU passed through, pods consuming vGPUs as vfio devices, a VM written for device plugins
(``gpus[].deviceName``, served through a DeviceClass mapping its classic resource name), and one
workload too many. A VM and a pod share the first T4, a VM and a pod share the A100 through
MIG-backed vGPUs at two GPU-instance placements, and a DRA VM, the classic VM and a pod share the L40S in
mixed-size mode, a VM's 8 GiB vGPU beside the pod's 12 GiB one, each at its own placement (its slots):
each GPU's vGPUs draw on its one counter set, which is why the workload too
many (another T4 vGPU) is refused by the scheduler model, with its reason. Each workload's
claims are made from its templates, allocated by the scheduler model, prepared by the kubelet
plugin over its real sockets (the vGPUs appear on the simulated host, which is checked), and run
the shipped health check on the device nodes they got. Then everything is torn down and the host
is checked to be clean again. The report shows, per physical GPU, who holds what and what is left,
and why the extra workload was refused.

``preset="rtxpro-node"`` runs the same on four RTX PRO 6000 Blackwell Server Edition (#38) in the dra
layout of ``examples/rtxpro-layout.yaml``: time-sliced, mixed-size, MIG with several vGPUs per GPU
instance (MIG time-slicing), and whole; a VM and a pod share one GPU instance, each vGPU at its own
placement inside it, and a second VM asking for the one GPU offered whole is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from fractions import Fraction

from dra_bridge.api.quantity import format_quantity, parse_quantity
from dra_bridge.scheduling import capacity
from dra_bridge.scheduling.selectors import Selectors
from dra_bridge.sim.cluster import Render, SimCluster
from dra_bridge.sim.workloads import DEMO_LAYOUT, Workload


@dataclass(frozen=True)
class DemoWorkload:
    name: str
    what: str  # one line for people
    kind: str  # vm | classic-vm | pod
    values: dict
    expect: str = "Running"  # Running | Pending


WORKLOADS: tuple[DemoWorkload, ...] = (
    DemoWorkload("vm-t4-a", "VM: T4-8Q vGPU", "vm", {"gpus": {"T4-8Q": 1}}),
    DemoWorkload("pod-t4", "pod: T4-8Q vGPU", "pod", {"profile": "T4-8Q"}),  # shares GPU 0 with vm-t4-a
    DemoWorkload("vm-a100", "VM: A100-3-20C MIG-backed vGPU", "vm", {"gpus": {"A100-3-20C": 1}}),
    DemoWorkload("pod-a100", "pod: A100-1-5C MIG-backed vGPU", "pod", {"profile": "A100-1-5C"}),  # same A100
    DemoWorkload("vm-passthrough", "VM: a whole T4", "vm", {"passthrough": "TU104GL [Tesla T4]"}),
    DemoWorkload("vfio-pod", "pod: L40S-12Q vGPU", "pod", {"profile": "L40S-12Q"}),
    # the L40S runs in mixed-size mode: the VM's 8 GiB vGPU beside the pod's 12 GiB one, each at its placement
    DemoWorkload("vm-l40s", "VM: L40S-8Q vGPU", "vm", {"gpus": {"L40S-8Q": 1}}),
    # a VM written for device plugins (gpus[].deviceName), unchanged: its class maps the classic
    # resource name (KEP-5004), so it draws on the same L40S counters as the DRA VM and the pod
    DemoWorkload("vm-classic", "VM: L40S-12Q by deviceName (device-plugin era)", "classic-vm",
                 {"gpus": {"L40S-12Q": 1}}),
    DemoWorkload("vm-t4-c", "VM: T4-8Q vGPU", "vm", {"gpus": {"T4-8Q": 1}}, expect="Pending"),
)


#: examples/rtxpro-layout.yaml's dra layout (a test keeps them equal): GPU 2 in MIG mode offers DC-1-6Q
#: (4 per 1g.24gb instance) and DC-2-24Q (2 per 2g.48gb), GPU 3 is offered whole
RTXPRO_LAYOUT = """\
version: vgpuctl/v1
layouts:
  dra:
    - index: 0
      mode: dra
    - index: 1
      mode: dra
      mixedSize: true
    - index: 2
      mode: dra
      migMode: true
      vgpus: {DC-1-6Q: 16, DC-2-24Q: 4}
    - index: 3
      mode: dra
      passthrough: true
"""
RTXPRO_WHOLE = "GB202GL [RTX PRO 6000 Blackwell Server Edition]"

RTXPRO_WORKLOADS: tuple[DemoWorkload, ...] = (
    DemoWorkload("vm-mig", "VM: DC-1-6Q in a GPU instance", "vm", {"gpus": {"DC-1-6Q": 1}}),
    DemoWorkload("pod-mig", "pod: DC-1-6Q, same instance", "pod", {"profile": "DC-1-6Q"}),  # shares vm-mig's GI
    DemoWorkload("vm-mig-2g", "VM: DC-2-24Q in a GPU instance", "vm", {"gpus": {"DC-2-24Q": 1}}),
    DemoWorkload("vm-sliced", "VM: DC-8Q vGPU (time-sliced)", "vm", {"gpus": {"DC-8Q": 1}}),
    DemoWorkload("pod-sliced", "pod: DC-8Q vGPU", "pod", {"profile": "DC-8Q"}),
    DemoWorkload("vm-whole", "VM: a whole RTX PRO 6000", "vm", {"passthrough": RTXPRO_WHOLE}),
    DemoWorkload("vm-whole-b", "VM: a whole RTX PRO 6000", "vm", {"passthrough": RTXPRO_WHOLE}, expect="Pending"),
)


@dataclass(frozen=True)
class DemoPreset:
    layout: str
    layout_name: str
    workloads: tuple[DemoWorkload, ...]
    shares_instance: bool = False  # a VM and a pod must share one GPU instance (MIG time-slicing)


PRESETS = {"default": DemoPreset(DEMO_LAYOUT, "demo", WORKLOADS),
           "rtxpro-node": DemoPreset(RTXPRO_LAYOUT, "dra", RTXPRO_WORKLOADS, shares_instance=True)}


def demo_device_classes(workloads: tuple[DemoWorkload, ...] = WORKLOADS) -> dict:
    """The ``render deviceclasses`` values of the demo's cluster: a class per classic VM's type,
    mapped to its classic resource name."""
    classic = sorted({p for w in workloads if w.kind == "classic-vm" for p in w.values["gpus"]})
    return {"profiles": classic, "extended_resources": True}


def render_workload(w: DemoWorkload, render: Render) -> list[dict]:
    """The objects ``w`` is made of (a VM; or a claim template and the pod that uses it), from ``render``."""
    if w.kind == "vm":
        return render("vm", {"name": w.name, "mode": "dra", **w.values})
    if w.kind == "classic-vm":
        return render("vm", {"name": w.name, "mode": "classic", **w.values})
    template = render("claim-template", {"profile": w.values["profile"]})
    name = template[0]["metadata"]["name"]
    return template + render("passthrough-pod", {"name": w.name, "claim_template": name})


# --------------------------------------------------------------------------- the report


@dataclass
class Holder:
    workload: str
    owner: str  # VM | pod: what holds the claim
    kind: str  # vgpu | passthrough
    profile: str
    memory: int | None
    device: str
    host_id: str | None
    iommu_group: int | None
    classic: bool = False  # asked by a classic resource name (deviceName); found through MDEV_/PCI_RESOURCE_<R>
    slots: tuple[int, int] | None = None  # mixed-size mode: (first slot, slots) the vGPU holds
    instance: tuple[int, int] | None = None  # MIG-backed: its GPU instance's memory slices (start, size)
    inside: int | None = None  # MIG time-slicing: its placement inside the instance


@dataclass
class GpuView:
    index: int | None
    address: str | None
    model: str | None
    framework: str
    counter_set: str | None
    memory_total: int | None  # bytes
    memory_used: int
    vgpus_total: int | None
    vgpus_used: int
    slices_total: int = 0  # a GPU in MIG mode: memory slices (NVIDIA's memory-slice-k counters)
    slices_used: int = 0
    slots_total: int = 0  # a GPU in mixed-size mode: its 1 GiB slots (the placement counters add up to them)
    holders: list[Holder] = field(default_factory=list)
    left: list[dict] = field(default_factory=list)  # {"profile", "fits", "of"}


@dataclass
class DemoReport:
    node: str
    preset: str
    kubernetes: str
    cel: str
    feature_gates: dict[str, bool] = field(default_factory=dict)  # the server's, every gate of its version
    layout: dict = field(default_factory=dict)
    slices: dict = field(default_factory=dict)
    workloads: list[dict] = field(default_factory=list)
    gpus: list[GpuView] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    shared: list[dict] = field(default_factory=list)  # GPUs whose counters VMs and pods hold together
    shared_instances: list[dict] = field(default_factory=list)  # GPU instances VMs and pods hold together
    host_problems: list[str] = field(default_factory=list)
    teardown: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _bytes(q: str | None) -> int | None:
    return int(parse_quantity(q)) if q is not None else None


def _human(b: int | Fraction | None) -> str:
    return "-" if b is None else format_quantity(Fraction(b), human=True)


def _gpu_views(c: SimCluster, owners: dict[str, Workload], frameworks: dict[str, str]) -> list[GpuView]:
    """Per physical GPU: the counters (from the slices), who holds what (claims -> workloads, and
    the host identity the workload got), and what more fits (the capacity module)."""
    report = capacity.compute(c.slices(), c.claims(), driver=c.driver, selectors=c.selectors)
    inv = c.inventory()
    out = []
    for g in report.gpus:
        # a GPU in mixed-size mode counts 1 GiB slots (pool/placements.py): they add up to its memory
        slots = sum(int(v) for k, v in g.totals.items() if k.startswith("slots-"))
        held = sum(int(v) for k, v in g.used.items() if k.startswith("slots-"))
        view = GpuView(index=g.index, address=g.gpu, model=g.product, framework=frameworks.get(g.gpu or "", "?"),
                       counter_set=g.counter_set,
                       memory_total=slots * 2**30 if slots else _bytes(g.totals.get("memory")),
                       memory_used=held * 2**30 if slots else _bytes(g.used.get("memory")) or 0,
                       slots_total=slots,
                       vgpus_total=int(g.totals["vgpus"]) if "vgpus" in g.totals else None,
                       vgpus_used=int(g.used.get("vgpus", 0) or 0),
                       slices_total=len(_slices(g.totals)),
                       slices_used=len(_slices({k: v for k, v in g.used.items() if v not in ("0", 0)})))
        for h in g.holders:
            claim = h["claim"].split("/", 1)[-1]
            w = owners.get(claim)
            dev = next((d for d in (w.devices if w else []) if d.device == h["device"]), None)
            view.holders.append(Holder(workload=w.name if w else claim, owner=_owner(w),
                                       kind=dev.kind if dev else "?",
                                       profile=h["profile"], memory=int(dev.memory) if dev and dev.memory else None,
                                       device=h["device"], host_id=dev.host_id if dev else None,
                                       iommu_group=dev.iommu_group if dev else None,
                                       classic=bool(dev and dev.env),
                                       slots=(0, slots) if slots and dev and dev.kind == "passthrough"
                                       else dev.slots if dev else None,
                                       instance=dev.instance if dev else None, inside=dev.inside if dev else None))
        if view.memory_total is None and view.slices_total:  # shared instances: no memory counter (migshare)
            found = inv.gpu(g.gpu or "")
            mig = found.mig if found else None
            view.memory_total = max((p.memory_mib for p in mig.profiles), default=0) * 2**20 if mig else None
            view.memory_used = sum(h.memory or 0 for h in view.holders)
        view.left = [{"profile": p.profile, "fits": p.fits, "of": p.published, "memory": p.memory}
                     for p in g.profiles]
        out.append(view)
    return out


def _slices(counters: dict) -> set[str]:
    """The memory slices a GPU in MIG mode counts: ``memory-slice-<k>``, or the cells of slice k
    where its instances are shared (``memory-slice-<k>-<cell>``, pool/migshare.py)."""
    return {k.split("-")[2] for k in counters if k.startswith("memory-slice-")}


def shared_instances(gpus: list[GpuView]) -> list[dict]:
    """The GPU instances a VM and a pod both have a vGPU in (MIG time-slicing), with where each sits."""
    out = []
    for g in gpus:
        by_gi: dict[tuple[int, int], list[Holder]] = {}
        for h in g.holders:
            if h.instance is not None and h.inside is not None:
                by_gi.setdefault(h.instance, []).append(h)
        for (start, size), hs in sorted(by_gi.items()):
            if {h.owner for h in hs} >= {"VM", "pod"}:
                out.append({"gpu": g.index, "address": g.address, "slices": [start, size],
                            "holders": [{"workload": h.workload, "owner": h.owner, "profile": h.profile,
                                         "placement": h.inside, "device": h.device} for h in hs]})
    return out


def _owner(w: Workload | None) -> str:
    return "VM" if w is not None and w.kind == "VirtualMachine" else "pod" if w is not None else "?"


def shared_gpus(gpus: list[GpuView]) -> list[dict]:
    """The GPUs whose one counter set VMs and pods draw on together: one accounting for both."""
    out = []
    for g in gpus:
        vms = [h.workload for h in g.holders if h.owner == "VM"]
        pods = [h.workload for h in g.holders if h.owner == "pod"]
        if vms and pods:
            out.append({"gpu": g.index, "address": g.address, "counter_set": g.counter_set, "vms": vms,
                        "classic_vms": [h.workload for h in g.holders if h.owner == "VM" and h.classic],
                        "pods": pods, "memory_used": g.memory_used, "memory_total": g.memory_total})
    return out


def _refusal_detail(w: Workload, gpus: list[GpuView], profile: str) -> list[str]:
    """Per GPU that publishes the profile the workload asked for: why it cannot take it."""
    lines = []
    for g in gpus:
        if not any(left["profile"] == profile for left in g.left):
            continue
        whole = [h for h in g.holders if h.kind == "passthrough"]
        label = f"GPU {g.index} ({g.address})"
        if whole:
            lines.append(f"{label}: the whole GPU is passed through to {whole[0].workload}")
        elif g.holders:
            held = ", ".join(f"{h.owner} {h.workload} ({h.profile}, {_human(h.memory)})" for h in g.holders)
            free = (g.memory_total or 0) - g.memory_used
            lines.append(f"{label}: {_human(g.memory_used)} of {_human(g.memory_total)} in use by {held}; "
                         + (f"{_human(free)} left" if free else "nothing left"))
        else:
            lines.append(f"{label}: free, yet refused (unexpected)")
    others: dict[str, list[str]] = {}  # model -> the GPUs of it that do not publish the profile (by number:
    for g in gpus:  # another GPU of the same model may publish it, as rtxpro-node's GPU 3 its whole GPU)
        if not any(left["profile"] == profile for left in g.left):
            others.setdefault(g.model or "?", []).append("?" if g.index is None else str(g.index))
    if others:
        lines.append(", ".join(f"GPU {', '.join(idx)} ({model})" for model, idx in others.items())
                     + f": no {profile} devices published")
    return lines


def run_demo(version: str = "1.36", *, render: Render, feature_gates: dict[str, bool] | None = None,
             selectors: Selectors | None = None, progress: Callable[[str], None] | None = None,
             preset: str = "default") -> DemoReport:
    """Run the demo end to end on a server of ``version`` with ``feature_gates`` over that version's
    defaults (as a real kube-apiserver of it runs), its objects made by ``render`` (:data:`.cluster.Render`);
    ``progress(str)`` is called as steps complete; ``preset``: the simulated node (:data:`PRESETS`)."""
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    spec_of = PRESETS[preset]
    with SimCluster(render=render, version=version, selectors=selectors, device_classes=demo_device_classes(spec_of.workloads),
                    feature_gates=dict(feature_gates or {}), preset=preset, layout=spec_of.layout,
                    layout_name=spec_of.layout_name) as c:
        assert c.srv is not None and c.kubelet is not None and c.daemon is not None and c.base is not None  # started
        inv = c.inventory()
        rep = DemoReport(node=c.node, preset=c.preset, kubernetes=c.srv.git_version,
                         cel=type(c.selectors).__name__, feature_gates=dict(c.srv.feature_gates))
        rep.layout = {"name": c.layout_name, "gpus": [
            {"index": g.index, "address": g.address, "model": g.model, "framework": g.framework,
             "vfs": g.sriov_num_vfs} for g in inv.gpus], "text": spec_of.layout}
        slices = c.slices()
        rep.slices = {"count": len(slices),
                      "devices": sum(len(s["spec"].get("devices") or []) for s in slices),
                      "counter_sets": sum(len(s["spec"].get("sharedCounters") or []) for s in slices),
                      "generation": max((s["spec"]["pool"]["generation"] for s in slices), default=0),
                      "plugin_socket": c.kubelet.endpoint}
        say("node and DRA bridge up")
        owners: dict[str, Workload] = {}
        launched: list[tuple[DemoWorkload, Workload]] = []
        for spec in spec_of.workloads:
            w = c.launch(render_workload(spec, render), name=spec.name)
            for claim, _ in w.claims:
                owners[claim] = w
            launched.append((spec, w))
            if w.phase != spec.expect:
                rep.problems.append(f"{spec.name}: {w.phase} ({w.reason}), expected {spec.expect}")
            if w.health is not None and w.health.result == "Fail":
                rep.problems.append(f"{spec.name}: health check failed: {w.health.summary()}")
            say(f"{spec.name}: {w.phase}")
        for _spec, w in launched:
            rep.host_problems += c.host_problems(w)
        rep.problems += rep.host_problems
        rep.gpus = _gpu_views(c, owners, {g.address: g.framework for g in inv.gpus})
        rep.shared = shared_gpus(rep.gpus)
        if not rep.shared:
            rep.problems.append("no GPU is shared by a VM and a pod")
        rep.shared_instances = shared_instances(rep.gpus)
        if spec_of.shares_instance and not rep.shared_instances:
            rep.problems.append("no GPU instance is shared by a VM and a pod")
        classic_vms = {w.name for spec, w in launched if spec.kind == "classic-vm"}
        if classic_vms and not any(set(g["classic_vms"]) & classic_vms and set(g["vms"]) - classic_vms
                                   for g in rep.shared):
            rep.problems.append("no GPU's counters are shared by a classic deviceName VM and a DRA VM")
        for spec, w in launched:
            d = w.to_dict()
            d["what"] = spec.what
            rep.workloads.append(d)
            if w.phase == "Pending":
                whole = "passthrough" in spec.values
                profile = "whole GPU" if whole else (
                    next(iter(spec.values.get("gpus", {}) or {}), None) or spec.values.get("profile") or "?")
                rep.refused.append({"workload": w.name, "owner": _owner(w), "asked": profile, "whole": whole,
                                    "reason": w.reason, "per_gpu": _refusal_detail(w, rep.gpus, profile)})
        # ---- teardown
        before = {v.id for v in c.inventory().all_vgpus()}
        passed_through = [d.gpu for _, w in launched for d in w.devices if d.kind == "passthrough"]
        for _, w in reversed(launched):
            c.teardown(w)
        after = c.inventory()
        leftovers = [v.id for v in after.all_vgpus()]
        still_vfio = [a for a in passed_through if (g := after.gpu(a or "")) is not None and g.driver == "vfio-pci"]
        rep.teardown = {"workloads": len(launched), "vgpus_removed": len(before) - len(leftovers),
                        "gpus_returned": [a for a in passed_through if a not in still_vfio],
                        "claims_left": len(c.claims()), "prepared_left": len(c.daemon.driver.cp.claims),
                        "cdi_files_left": len(list((c.base / "cdi").glob("*.json"))),
                        "vgpus_left": leftovers, "still_on_vfio": still_vfio}
        for key in ("claims_left", "prepared_left", "cdi_files_left"):
            if rep.teardown[key]:
                rep.problems.append(f"teardown: {key} = {rep.teardown[key]}")
        if leftovers or still_vfio:
            rep.problems.append(f"teardown: host not clean: vGPUs {leftovers}, on vfio-pci {still_vfio}")
        say("torn down")
    rep.seconds = round(time.perf_counter() - t0, 2)
    return rep
