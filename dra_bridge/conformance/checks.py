"""``vgpuctl conformance``: the automated tests KAR-0003 and KAR-0004 propose, as five checks.

1. One physical GPU is exposed as several allocatable logical GPUs.
2. Several workloads using one ResourceClaimTemplate for logical GPUs all land on that GPU's node
   and run on the same physical GPU.
3. Asking for one logical GPU more than the GPU holds is blocked: the extra workload stays pending
   with the scheduler's reason, and nothing already running is disturbed.
4. Workloads requesting vGPUs and workloads requesting physical devices (a whole GPU through vfio)
   through the same DRA mechanism are allocated, isolated (distinct devices, distinct IOMMU groups)
   and accounted (against the same per-GPU counters) with identical semantics; MIG-backed vGPUs
   beside time-sliced ones where a GPU is in MIG mode; vGPUs of three sizes on one GPU in mixed-size
   mode, each at its own placement, where one is published; and, where a DeviceClass maps an extended
   resource name, KAR-0004's pod asking for it by name (``nvidia.com/GRID_T4-1Q: 1``).
5. Every workload runs the shipped accelerator health check (:mod:`dra_bridge.conformance.healthcheck`), which
   reports Pass, Fail, or Unknown for an accelerator it does not recognise (not a failure).

The checks talk to a cluster only through its API (:class:`~dra_bridge.conformance.backend.KubeBackend`).
Against a real cluster (``--kubeconfig``) that is all; by default the same code runs against the
simulated cluster (:class:`~dra_bridge.sim.cluster.SimCluster` with its
:class:`~dra_bridge.sim.cluster.ControlPlane`), where the checks also compare what the workloads got
with the simulated host itself. The report they fill is :mod:`.report`'s.

The physical GPU a workload runs on is judged twice: from the ResourceSlice (the device's
``parentPciBusID`` / ``pciBusID``) and from inside the workload (the health check reports the PCI
address of the GPU behind every vfio group it was given); they must agree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_bridge.api.attributes import ATTR_GPU_INDEX, ATTR_MIG_BACKED, ATTR_PLACEMENT_SIZE, ATTR_TYPE
from dra_bridge.apiclient.errors import api_exception, brief
from dra_bridge.conformance.backend import KubeBackend, Run, random_suffix
from dra_bridge.conformance.mixed import mixed_sizes
from dra_bridge.conformance.report import TITLES, CheckFailed, CheckResult, ConformanceReport
from dra_bridge.scheduling.objects import dev_attr, dev_gpu

log = logging.getLogger(__name__)


def _cel(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class Target:
    node: str | None
    gpu: str | None  # PCI address
    index: int | None
    product: str | None
    counter_set: str | None
    profile: str
    fits: int
    published: int


class Conformance:
    def __init__(self, backend: KubeBackend, *, profile: str | None = None, node: str | None = None,
                 max_workloads: int = 8):
        self.b = backend
        self.profile = profile
        self.node = node
        self.max_workloads = max_workloads
        self.results = {n: CheckResult(n, TITLES[n]) for n in TITLES}
        self.target: Target | None = None
        self.ran: list[Run] = []  # every run that reached Running (for check 5)
        self.check2_runs: list[Run] = []
        self._tmpl_vgpu: str | None = None

    # ------------------------------------------------------------ helpers
    @property
    def chosen(self) -> Target:
        """The GPU check 1 chose (checks 2 to 4 run only once it did)."""
        if self.target is None:
            raise CheckFailed("check 1 chose no GPU")
        return self.target

    def _gpu_sel(self, index: int | None, gpu: str | None, kind: str) -> str:
        d = _cel(self.b.driver)
        if index is not None:
            return f"device.attributes[{d}].gpuIndex == {int(index)}"
        if gpu is None:
            raise CheckFailed("a GPU that publishes neither its index nor its PCI address cannot be selected")
        if kind == "vgpu":
            return f"device.attributes[{d}].parentPciBusID == {_cel(gpu)}"
        return f'device.attributes["resource.kubernetes.io"].pciBusID == {_cel(gpu)}'

    def _profile_sel(self, profile: str) -> str:
        """A device that can become ``profile``: a size slot or MIG placement listing it in
        ``vgpuTypes``, else (an agent that publishes no such list) one of that ``profile``."""
        d = _cel(self.b.driver)
        return (f"has(device.attributes[{d}].vgpuTypes) ? device.attributes[{d}].vgpuTypes.contains("
                f"{_cel(' ' + profile + ' ')}) : device.attributes[{d}].profile == {_cel(profile)}")

    def _require_running(self, r: Run, what: str) -> None:
        if r.phase != "Running":
            raise CheckFailed(f"{what} {r.name} did not run: {r.phase}: {r.reason}")
        self.ran.append(r)

    def _same_gpu(self, r: Run, gpu: str | None) -> list[str]:
        """Where the workload's view (health check) or the host contradict the slice's GPU."""
        problems = []
        for d in r.devices:
            if d["gpu"] != gpu:
                problems.append(f"{r.name}: device {d['device']} is published on GPU {d['gpu']}, not {gpu}")
        seen = r.health.gpus if r.health else set()
        if not seen:
            problems.append(f"{r.name}: the health check saw no GPU")
        elif seen != {gpu}:
            problems.append(f"{r.name}: inside the workload the devices belong to GPU {', '.join(sorted(seen))}, "
                            f"the slice says {gpu}")
        host = self.b.host(r)
        if host:
            problems += host
        return problems

    def _groups(self, r: Run) -> set[int]:
        return r.health.groups if r.health else set()

    def _run(self, n: int, fn: Callable[[CheckResult], str | None]) -> None:
        res = self.results[n]
        t0 = time.perf_counter()
        try:
            res.detail = fn(res) or ""
            res.status = "passed"
        except CheckFailed as exc:
            res.status, res.detail = "failed", str(exc)
        except Exception as exc:  # the check could not be carried out: one line (--verbose: the traceback)
            log.debug("check %s", n, exc_info=True)
            res.status, res.detail = "error", one_line_error(exc)
        res.seconds = time.perf_counter() - t0

    def _skip(self, n: int, why: str) -> None:
        self.results[n].status, self.results[n].detail = "skipped", why

    # ------------------------------------------------------------ check 1
    def check1(self, res: CheckResult) -> str:
        cap = self.b.capacity()
        cands, over = [], []
        for g in cap.gpus:
            if self.node and g.node != self.node:
                continue
            for p in g.profiles:
                if p.kind != "vgpu" or (self.profile and p.profile != self.profile):
                    continue
                res.evidence.append(f"node {g.node} GPU {g.index} {g.gpu} ({g.product}): {p.published} {p.profile} "
                                    f"devices published, {p.fits} allocatable now")
                if p.fits >= 2 and p.fits <= self.max_workloads:
                    cands.append((p.fits, g.node or "", g.index if g.index is not None else 1 << 30, g, p))
                elif p.fits > self.max_workloads:
                    over.append((p.fits, g.index if g.index is not None else 1 << 30, p.profile, g.gpu))
        if not cands:
            # a GPU that offers only its smallest size (no shared counters: 1.34 and 1.35 default gates)
            # holds more than the default; say how many would do rather than only that none does
            fewest = ""
            if over:
                n, _, prof, gpu = min(over)
                fewest = f"; the fewest on one GPU: {n} {prof} on {gpu}: rerun with --max-workloads {n} or a larger --profile"
            raise CheckFailed("no physical GPU exposes two or more allocatable logical GPUs"
                              + (f" of profile {self.profile}" if self.profile else "")
                              + (f" on node {self.node}" if self.node else "")
                              + f" (at most {self.max_workloads} considered){fewest}")
        fits, _, _, g, p = min(cands, key=lambda c: c[:3])
        self.target = Target(node=g.node, gpu=g.gpu, index=g.index, product=g.product, counter_set=g.counter_set,
                             profile=p.profile, fits=fits, published=p.published)
        allocated = self._scheduled(res, fits)
        return (f"GPU {g.index} {g.gpu} ({g.product}) on node {g.node} publishes {p.published} {p.profile} devices "
                f"consuming counter set {g.counter_set}; the cluster's scheduler allocates {fits} of them at once "
                f"({allocated}); " + self._allocatable(res, g.node))

    def _scheduled(self, res: CheckResult, fits: int) -> str:
        """The cluster's own scheduler, not a model, shows the logical GPUs allocatable: ``fits``
        workloads of the chosen profile on the chosen GPU, created at once, are each bound with a
        device of that GPU allocated to its claim (check 2 then watches them run)."""
        t = self.chosen
        runs = [self.b.create(f"logical-{i}-{random_suffix()}", self.tmpl_vgpu, t.node) for i in range(fits)]
        self.check2_runs = runs
        for r in runs:
            self.b.wait(r, expect="Scheduled")
            res.evidence.append(f"{r.name}: " + (f"bound to {r.bound_node}, claim {', '.join(r.claims)} allocated "
                                                 f"{', '.join(d['device'] + ' on ' + str(d['gpu']) for d in r.devices)}"
                                                 if r.bound_node and r.devices else f"{r.phase} ({r.reason})"))
        off = [r for r in runs if not r.bound_node or not r.devices]  # on which GPU: check 2's to judge
        if off:
            raise CheckFailed(f"the cluster's scheduler allocated {fits - len(off)} of the {fits} {t.profile} logical "
                              f"GPUs of GPU {t.gpu} the slices offer: " + "; ".join(r.line() for r in off))
        devices = [d["device"] for r in runs for d in r.devices]
        return f"pods {', '.join(r.name for r in runs)} bound, their claims allocated {', '.join(devices)}"

    def _allocatable(self, res: CheckResult, node: str | None) -> str:
        """KAR-0003's first step: the node's Allocatable lists the statically configured shared GPUs
        (the device-plugin path). With DRA they are the ResourceSlice devices above instead, and a
        DeviceClass may map a resource name to them (KEP-5004) without it being in Allocatable."""
        alloc = self.b.node_allocatable(node) if node else {}
        ext = {k: v for k, v in alloc.items() if "/" in k and not k.startswith("hugepages-")}
        res.evidence.append(f"node {node} allocatable: " + (", ".join(f"{k}: {v}" for k, v in sorted(ext.items()))
                                                            or "no extended resources"))
        if ext:
            return (f"node {node}'s Allocatable lists {sum(int(v) for v in ext.values() if str(v).isdigit())} "
                    f"statically configured logical GPUs ({', '.join(sorted(ext))})")
        return f"node {node}'s Allocatable lists none: its logical GPUs are DRA devices (KAR-0003's Allocatable step)"

    # ------------------------------------------------------------ check 2
    @property
    def tmpl_vgpu(self) -> str:
        """The ResourceClaimTemplate for one logical GPU of the target profile on the target GPU."""
        if self._tmpl_vgpu is None:
            t = self.chosen
            sels = [self._profile_sel(t.profile), self._gpu_sel(t.index, t.gpu, "vgpu")]
            self._tmpl_vgpu = self.b.template(f"logical-gpu-{random_suffix()}", self.b.vgpu_class, sels,
                                              vgpu_type=t.profile)
        return self._tmpl_vgpu

    def stop_all(self) -> None:
        for r in list(self.b.runs):
            self.b.stop(r)

    def check2(self, res: CheckResult) -> str:
        t = self.chosen
        runs = self.check2_runs  # check 1's, which the scheduler allocated
        problems = []
        for r in runs:
            self.b.wait(r)
            res.evidence.append(r.line())
            self._require_running(r, "workload")
            problems += self._same_gpu(r, t.gpu)
            if r.bound_node != t.node:
                problems.append(f"{r.name}: runs on node {r.bound_node}, the GPU is on {t.node}")
        devices = [d["device"] for r in runs for d in r.devices]
        if len(set(devices)) != len(devices):
            problems.append(f"devices allocated twice: {devices}")
        if problems:
            raise CheckFailed("; ".join(problems))
        return (f"{len(runs)} workloads from ResourceClaimTemplate {self.tmpl_vgpu} run on node {t.node}, "
                f"all on GPU {t.gpu} (by the slices, inside the workloads" +
                (", and on the host)" if self.b.host_problems else ")") + f": {', '.join(devices)}")

    # ------------------------------------------------------------ check 3
    def check3(self, res: CheckResult) -> str:
        t = self.chosen
        before = {r.name: [d["device"] for d in r.devices] for r in self.check2_runs}
        extra = self.b.start(f"one-more-{random_suffix()}", self.tmpl_vgpu, t.node, expect="Pending")
        res.evidence.append(extra.line())
        tmpl_any = self.b.template(f"any-logical-gpu-{random_suffix()}", self.b.vgpu_class,
                                   [self._gpu_sel(t.index, t.gpu, "vgpu")])
        any_run = self.b.start(f"one-more-any-{random_suffix()}", tmpl_any, t.node, expect="Pending")
        res.evidence.append(any_run.line())
        problems = []
        for r, what in ((extra, f"one more {t.profile}"), (any_run, "one more logical GPU of any profile")):
            if r.phase == "Running":
                self.ran.append(r)
            if r.phase == "Running" or r.bound_node:
                problems.append(f"{what} was allocated although the GPU was full ({r.line()})")
            elif r.phase != "Pending" or not r.reason:
                problems.append(f"{what}: {r.phase} without the scheduler's reason ({r.reason})")
        for r in self.check2_runs:
            self.b.refresh(r)
            now = [d["device"] for d in r.devices]
            if r.phase != "Running" or r.restarts or now != before[r.name]:
                problems.append(f"{r.name} was disturbed: {r.phase}, restarts {r.restarts}, devices {now} "
                                f"(were {before[r.name]})")
            host = self.b.host(r)
            if host:
                problems += host
        for r in (extra, any_run, *self.check2_runs):
            self.b.stop(r)
        if problems:
            raise CheckFailed("; ".join(problems))
        return (f"the extra workload stays Pending: {extra.reason}; a request for any logical GPU of GPU {t.gpu} "
                f"stays Pending too; the {len(self.check2_runs)} running workloads kept their devices")

    # ------------------------------------------------------------ check 4
    def check4(self, res: CheckResult) -> str:
        t = self.chosen
        cap = self.b.capacity()
        whole = [(g, p) for g in cap.gpus for p in g.profiles
                 if p.kind == "passthrough" and p.fits >= 1 and g.node == t.node]
        a_whole = next((p for g, p in whole if g.gpu == t.gpu), None)
        if a_whole is None:
            raise CheckFailed(f"GPU {t.gpu} publishes no allocatable whole-GPU device" + (
                "" if t.counter_set else ", nor shared counters: where the API server drops them (1.34 and 1.35 "
                "default gates) a GPU offers its vGPUs or itself whole, never both, so the two cannot be accounted "
                "together; enable DRAPartitionableDevices"))
        others = sorted((g for g, _ in whole if g.gpu != t.gpu),
                        key=lambda g: (g.product != t.product, g.index if g.index is not None else 1 << 30))
        tmpl_whole_a = self.b.template(f"whole-gpu-a-{random_suffix()}", self.b.passthrough_class,
                                       [self._gpu_sel(t.index, t.gpu, "passthrough")])
        problems: list[str] = []
        notes: list[str] = []

        def expect_pending(r: Run, what: str) -> None:
            res.evidence.append(r.line())
            if r.phase == "Running":
                self.ran.append(r)
            if r.phase == "Running" or r.bound_node:
                problems.append(f"{what} was allocated ({r.line()}): the whole GPU and its vGPUs are not "
                                "accounted against the same counters")
            elif r.phase != "Pending" or not r.reason:
                problems.append(f"{what}: {r.phase} ({r.reason})")

        v = self.b.start(f"vgpu-{random_suffix()}", self.tmpl_vgpu, t.node)
        res.evidence.append(v.line())
        self._require_running(v, "vGPU workload")
        problems += self._same_gpu(v, t.gpu)
        # accounted: the whole GPU of A waits while one of its vGPUs is allocated
        wait_a = self.b.start(f"whole-a-{random_suffix()}", tmpl_whole_a, t.node, expect="Pending")
        expect_pending(wait_a, f"a whole GPU {t.gpu} while a vGPU of it runs")
        p = None
        if others:
            b = others[0]
            tmpl_whole_b = self.b.template(f"whole-gpu-b-{random_suffix()}", self.b.passthrough_class,
                                           [self._gpu_sel(b.index, b.gpu, "passthrough")])
            p = self.b.start(f"whole-{random_suffix()}", tmpl_whole_b, t.node)
            res.evidence.append(p.line())
            self._require_running(p, "whole-GPU workload")
            problems += self._same_gpu(p, b.gpu)
            tmpl_vgpu_b = self.b.template(f"any-vgpu-b-{random_suffix()}", self.b.vgpu_class,
                                          [self._gpu_sel(b.index, b.gpu, "vgpu")])
            wait_b = self.b.start(f"vgpu-b-{random_suffix()}", tmpl_vgpu_b, t.node, expect="Pending")
            expect_pending(wait_b, f"a vGPU of GPU {b.gpu} while the whole GPU is passed through")
            self.b.stop(wait_b)
            # isolated: distinct devices and IOMMU groups, seen from inside the workloads
            dv, dp = {d["device"] for d in v.devices}, {d["device"] for d in p.devices}
            gv, gp = self._groups(v), self._groups(p)
            if dv & dp:
                problems.append(f"the vGPU and whole-GPU workloads share devices {sorted(dv & dp)}")
            if not gv or not gp or gv & gp:
                problems.append(f"IOMMU groups not distinct: vGPU workload {sorted(gv)}, whole-GPU workload {sorted(gp)}")
            notes.append(f"isolated: vGPU {sorted(dv)} in IOMMU group {sorted(gv)}, whole GPU {sorted(dp)} in "
                         f"IOMMU group {sorted(gp)}")
        # side by side: a vGPU of the other kind (MIG-backed beside time-sliced) on its GPU's counter set
        side = self._mig_beside(res, v, problems, notes)
        # released the same way: when the vGPU workload ends, the whole GPU it blocked is allocated
        self.b.stop(v)
        wait_a = self.b.wait(wait_a)
        res.evidence.append("after the vGPU workload ended: " + wait_a.line())
        if wait_a.phase != "Running":
            problems.append(f"the whole GPU {t.gpu} was not allocated after its vGPU was released: "
                            f"{wait_a.phase} ({wait_a.reason})")
        else:
            self.ran.append(wait_a)
            problems += self._same_gpu(wait_a, t.gpu)
            again = self.b.start(f"vgpu-again-{random_suffix()}", self.tmpl_vgpu, t.node, expect="Pending")
            expect_pending(again, f"a vGPU of GPU {t.gpu} while it is passed through whole")
            self.b.stop(again)
            if p is None:  # one GPU only: isolation between the two kinds, one after the other
                gv, gp = self._groups(v), self._groups(wait_a)
                if not gv or not gp or gv & gp:
                    problems.append(f"IOMMU groups not distinct: vGPU {sorted(gv)}, whole GPU {sorted(gp)}")
                notes.append(f"isolated: vGPU in IOMMU group {sorted(gv)}, whole GPU in {sorted(gp)}")
        # identical semantics: same driver, same claim mechanism, same counter set per GPU
        kinds: dict[str, set[tuple[str, bool]]] = {}
        for r in [x for x in (v, p, wait_a) if x is not None and x.devices]:
            for d in r.devices:
                kinds.setdefault(d["kind"], set()).add((d["driver"], d["counter_set"] is not None))
        if set(kinds) != {"vgpu", "passthrough"}:
            problems.append(f"not both kinds were allocated: {sorted(kinds)}")
        if any(k != {(self.b.driver, True)} for k in kinds.values()):
            problems.append(f"the kinds differ in driver or counters: {kinds}")
        sets = {d["counter_set"] for r in (v, wait_a) for d in r.devices}
        if len(sets) != 1:
            problems.append(f"the vGPU and the whole GPU {t.gpu} consume different counter sets: {sorted(sets)}")
        for r in [x for x in (p, wait_a, side) if x is not None]:
            self.b.stop(r)
        mixed_sizes(self, res, problems, notes)  # three sizes on a GPU in mixed-size mode, where one is published
        self._by_extended_resource(res, problems, notes)
        self._no_claim_no_accelerator(res, problems, notes)
        if problems:
            raise CheckFailed("; ".join(problems))
        return ("both kinds are requested by ResourceClaimTemplates of driver " + self.b.driver +
                f", allocated from the same pool and counter set {sets.pop()} of GPU {t.gpu} (a vGPU blocks the "
                "whole GPU, the whole GPU blocks its vGPUs, and releasing one lets the other run), prepared by the "
                "same plugin; " + "; ".join(notes))

    def _no_claim_no_accelerator(self, res: CheckResult, problems: list[str], notes: list[str]) -> None:
        """KAR-0049's negative case, as kubernetes-sigs/ai-conformance runs it: a pod with no claim on
        the same node sees no accelerator (its probe prints ``RESULT: ACCELERATOR_MISSING``)."""
        r = self.b.start(f"no-claim-{random_suffix()}", None, self.chosen.node)
        res.evidence.append(r.line())
        if r.phase != "Running" or r.health is None:
            problems.append(f"a pod without a claim did not run its probe: {r.phase} ({r.reason})")
        elif r.health.accelerator is not False:
            problems.append(f"{r.name}: a pod without a claim sees an accelerator (RESULT: ACCELERATOR_FOUND)")
        else:
            notes.append("a pod without a claim sees none (RESULT: ACCELERATOR_MISSING, KAR-0049)")
        self.b.stop(r)

    def _by_extended_resource(self, res: CheckResult, problems: list[str], notes: list[str]) -> None:
        """KAR-0004's request: a pod asking for an extended resource by name (``nvidia.com/GRID_T4-1Q: 1``,
        no claim of its own) where a DeviceClass maps that name (KEP-5004): it runs on one of the
        driver's devices, allocated through the scheduler's claim and counted on a GPU's counter set
        like every other workload. A cluster without such a class gets a note, not a failure."""
        t = self.chosen
        d = _cel(self.b.driver)
        mapped = sorted(self.b.extended_resource_classes(), key=lambda c: (
            f"{d}].type == \"vgpu\"" not in str(c["spec"].get("selectors")), c["metadata"]["name"]))
        if not mapped:
            notes.append("no DeviceClass maps an extended resource name, so KAR-0004's request by resource name "
                         "was not made (vgpuctl render deviceclasses --set extended_resources=true)")
            return
        cls = mapped[0]
        name = cls["spec"]["extendedResourceName"]
        r = self.b.start(f"by-name-{random_suffix()}", None, t.node, resource=name)
        res.evidence.append(f"{name} (DeviceClass {cls['metadata']['name']}): " + r.line())
        if r.phase != "Running":
            problems.append(f"a pod asking for {name}: 1 did not run: {r.phase} ({r.reason})")
            return
        self.ran.append(r)
        if not r.devices or any(x["driver"] != self.b.driver or x["counter_set"] is None for x in r.devices):
            problems.append(f"{r.name}: the devices for {name} are not this driver's counted devices: {r.devices}")
        seen = r.health.gpus if r.health else set()
        if not seen or seen != {x["gpu"] for x in r.devices}:
            problems.append(f"{r.name}: inside the workload the devices belong to {sorted(seen)}, the slices say "
                            f"{sorted({x['gpu'] for x in r.devices})}")
        notes.append(f"by resource name (KAR-0004): a pod asking for {name}: 1 got {[x['device'] for x in r.devices]} "
                     f"through the scheduler's claim {r.claims[-1]}, on counter set "
                     f"{', '.join(sorted({str(x['counter_set']) for x in r.devices}))}")
        self.b.stop(r)

    def _mig_beside(self, res: CheckResult, v: Run, problems: list[str], notes: list[str]) -> Run | None:
        """While ``v`` runs, a vGPU of the other kind on another GPU of the node: MIG-backed (a
        GPU-instance placement, consuming ``memory-slice-*`` counters) beside time-sliced, or the
        reverse. Both run at once, each counted on its own GPU's one counter set, and that GPU's
        whole-GPU device waits. A node without both kinds gets a note, not a failure."""
        t = self.chosen
        d = self.b.driver
        v_mig = any(x["mig_backed"] for x in v.devices)
        other: dict[str | None, list[dict]] = {}
        for dev in self.b.slice_devices().values():
            if dev.get("_node") != t.node or dev_attr(dev, ATTR_TYPE, d) != "vgpu" or dev_gpu(dev) == t.gpu:
                continue
            if (dev_attr(dev, ATTR_MIG_BACKED, d) is True) != v_mig:
                other.setdefault(dev_gpu(dev), []).append(dev)
        want = "time-sliced" if v_mig else "MIG-backed"
        if not other:
            notes.append(f"no GPU in {'time-sliced' if v_mig else 'MIG'} mode on node {t.node}: "
                         f"{want} vGPUs beside {'MIG-backed' if v_mig else 'time-sliced'} ones not exercised")
            return None
        def by_index(g: str | None) -> tuple[bool, int, str]:
            index = dev_attr(other[g][0], ATTR_GPU_INDEX, d)
            return (index is None, index or 0, g or "")

        gpu = min(other, key=by_index)
        index = dev_attr(other[gpu][0], ATTR_GPU_INDEX, d)
        sels = [self._gpu_sel(index, gpu, "vgpu"),
                f"{'!' if v_mig else ''}(has(device.attributes[{_cel(d)}].migBacked) && "
                f"device.attributes[{_cel(d)}].migBacked)"]
        if not v_mig:  # the smallest GPU-instance profile: a placement, not the whole GPU's memory
            small = min(other[gpu], key=lambda x: (dev_attr(x, ATTR_PLACEMENT_SIZE, d) or 0, x["name"]))
            sels.append(f"device.attributes[{_cel(d)}].profile == {_cel(dev_attr(small, 'profile', d))}")
        m = self.b.start(f"{'ts' if v_mig else 'mig'}-vgpu-{random_suffix()}",
                         self.b.template(f"{'ts' if v_mig else 'mig'}-vgpu-{random_suffix()}", self.b.vgpu_class, sels),
                         t.node)
        res.evidence.append(m.line())
        if m.phase != "Running":
            problems.append(f"a {want} vGPU of GPU {gpu} did not run beside {v.name}: {m.phase} ({m.reason})")
            return m
        self.ran.append(m)
        problems.extend(self._same_gpu(m, gpu))
        self.b.refresh(v)
        if v.phase != "Running":
            problems.append(f"{v.name} stopped while the {want} vGPU started: {v.phase}")
        mig_run = v if v_mig else m
        dm = [x for x in mig_run.devices if x["mig_backed"]]
        if not dm or not all(x["memory_slices"] for x in dm):
            problems.append(f"{mig_run.name}: the MIG-backed device consumes no memory-slice counter: {dm}")
        sets = {x["counter_set"] for x in m.devices} | {x["counter_set"] for x in v.devices}
        if len(sets) != 2 or None in sets:
            problems.append(f"the two vGPUs on two GPUs should consume two counter sets, one each: {sorted(map(str, sets))}")
        tmpl = self.b.template(f"whole-gpu-m-{random_suffix()}", self.b.passthrough_class,
                               [self._gpu_sel(index, gpu, "passthrough")])
        wait_m = self.b.start(f"whole-m-{random_suffix()}", tmpl, t.node, expect="Pending")
        res.evidence.append(wait_m.line())
        if wait_m.phase == "Running" or wait_m.bound_node:
            problems.append(f"the whole GPU {gpu} was allocated while its {want} vGPU runs ({wait_m.line()})")
        self.b.stop(wait_m)
        gv, gm = self._groups(v), self._groups(m)
        if not gv or not gm or gv & gm:
            problems.append(f"IOMMU groups not distinct: {v.name} {sorted(gv)}, {m.name} {sorted(gm)}")
        ms = ", ".join(f"{x['device']} ({', '.join(x['memory_slices'])})" for x in dm)
        notes.append(f"side by side: {'MIG-backed' if v_mig else 'time-sliced'} {[x['device'] for x in v.devices]} "
                     f"on {t.gpu} and {want} {[x['device'] for x in m.devices]} on {gpu}, each on its GPU's one "
                     f"counter set ({', '.join(sorted(map(str, sets)))}); the MIG-backed placement {ms} holds its memory slices "
                     f"and the whole GPU {gpu} waits while it runs")
        return m

    # ------------------------------------------------------------ check 5
    def check5(self, res: CheckResult) -> str:
        if not self.ran:
            raise CheckFailed("no workload ran")
        counts = {"Pass": 0, "Fail": 0, "Unknown": 0}
        problems = []
        for r in self.ran:
            if r.health is None:
                problems.append(f"{r.name}: no health check result")
                continue
            counts[r.health.result] += 1
            res.evidence.append(f"{r.name}: {r.health.summary()}")
            if r.health.result == "Fail":
                problems.append(f"{r.name}: {r.health.summary()}")
            if r.health.accelerator is False:  # ai-conformance's positive case: the claim's device is there
                problems.append(f"{r.name}: has a claim but its probe printed RESULT: ACCELERATOR_MISSING")
        if problems:
            raise CheckFailed("; ".join(problems))
        return (f"{len(self.ran)} workloads ran the health check: {counts['Pass']} Pass, {counts['Unknown']} Unknown "
                f"(an accelerator the check does not recognise), 0 Fail")

    # ------------------------------------------------------------ all
    def run(self) -> list[CheckResult]:
        self._run(1, self.check1)
        if self.results[1].status != "passed":
            for n in (2, 3, 4):
                self._skip(n, "needs check 1 (a GPU with several allocatable logical GPUs)")
        else:
            self._run(2, self.check2)
            if self.results[2].status == "passed":
                self._run(3, self.check3)
            else:
                self._skip(3, "needs check 2 (the GPU filled with workloads)")
            self.stop_all()
            self._run(4, self.check4)
            self.stop_all()
        if not self.ran and self.results[1].status != "passed":
            self._skip(5, "no workload ran (needs check 1)")
        else:
            self._run(5, self.check5)
        return [self.results[n] for n in sorted(self.results)]


def one_line_error(exc: BaseException) -> str:
    """An error in one line: an API server's answer as status, reason and message (the client's own
    text dumps headers and body), anything else as its type and first line."""
    if isinstance(exc, api_exception()):
        return f"the API server answered {brief(exc)}"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_conformance(backend: KubeBackend, **kw: Any) -> ConformanceReport:
    t0 = time.perf_counter()
    checks: list[CheckResult] = []
    cleanup: list[str] = []
    try:
        backend.setup()
        checks = Conformance(backend, **kw).run()
    except CheckFailed as exc:  # setup
        checks = [CheckResult(n, TITLES[n], "error" if n == 1 else "skipped", str(exc) if n == 1 else "setup failed")
                  for n in TITLES]
    finally:
        cleanup = backend.cleanup()
    return ConformanceReport(cluster=backend.label, namespace=backend.namespace, checks=checks, cleanup=cleanup,
                             seconds=round(time.perf_counter() - t0, 2))
