"""The campaign's GPU health steps (issue #40.4): faults NVML or the kernel reports, raised on any GPU,
on one a claim (a VM's vGPU) holds, during a kubelet's prepare, flapping; and recovery.

What must hold, checked by each step after the agent's resync (design: :mod:`dra_bridge.pool.health`):

* a faulted GPU's devices are all published with a ``vgpu.kubevirt.io/<kind>`` taint, effect
  ``NoSchedule`` (never ``NoExecute`` by default), or, where the server drops device taints, only
  its held devices stay published;
* nothing in use is removed: every device a prepared claim holds stays published and its vGPU stays
  on the host (a VM's holder keeps it: the ``devices`` invariant checks that after every step);
* a flapping GPU stays tainted while it flaps (hysteresis), and after the fault is cleared and the
  quiet period passed (the world's health clock, no sleep) no health taint is left and its free
  devices are published again.

The agent's health clock is the world's :class:`~tests.campaign.healthclock.HealthClock`, so a step
moves time past the quiet period without waiting. Faults are raised with the simulator's ``sim health``
(the same host file NVML and sysfs are read from).

Mutations ``t`` (the health taint never set) and ``u`` (a held device withdrawn on a fault) of
:mod:`tests.campaign.mutations` are caught at step 29 of seed 1 (300 steps, 2026-12-07, with the binding and
rebuild steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.pool.health import DEFAULT_QUIET_SECONDS, KINDS
from mdev_manager.discovery import discover
from tests.campaign.steps import Checks, _checkpoint, _new_claim, _pick
from tests.campaign.world import World

#: the fault ``sim health`` raises per driver the GPU is bound to, and the taint kind it must give
NVML_FAULTS = {"xid": "xid", "ecc": "xid", "lost": "gpu-lost", "hang": "unmonitored"}
PCI_FAULTS = {"fell-off": "gpu-lost", "link": "pci-link"}
HEALTH_KEYS = {f"{DEFAULT_DRIVER}/{k}" for k in KINDS}


def _gpus(world: World) -> dict[str, str]:
    """GPU address -> the driver it is bound to now (only those ``sim health`` faults are read on)."""
    inv = discover(world.env, world.node.io, node=world.node.node)
    return {g.address: g.driver for g in inv.gpus if g.driver in ("nvidia", "vfio-pci")}


def _held(world: World) -> dict[str, set[str]]:
    """GPU -> the device names prepared claims hold on it (the checkpoint's truth)."""
    cp = _checkpoint(world)
    out: dict[str, set[str]] = {}
    for rec in (cp.claims.values() if cp else ()):
        for d in rec.devices:
            out.setdefault(d.gpu, set()).add(d.device)
    return out


def _vgpus_held(world: World, gpu: str) -> set[str]:
    """The vGPUs on ``gpu`` that claims' records name and that exist now (taken before a fault): a
    record whose vGPU is not made again yet (of an earlier boot, its re-creation refused) names one
    that no fault can remove."""
    cp = _checkpoint(world)
    have = {v.id for v in discover(world.env, world.node.io, node=world.node.node).all_vgpus()}
    return {d.vgpu_id for rec in (cp.claims.values() if cp else ()) for d in rec.devices
            if d.gpu == gpu and d.vgpu_id and d.vgpu_id in have}


def _published(world: World) -> dict[str, dict]:
    return {d["name"]: d for s in world.srv.objects("resourceslices") if s["spec"].get("nodeName") == world.node.node
            for d in s["spec"].get("devices", [])}


def _raise(world: World, gpu: str, driver: str, pick: int) -> tuple[str, str]:
    """Raise a fault on ``gpu``: (the fault, the taint kind it must give). On NVIDIA's driver a GPU
    already lost or hung answers every NVML call with that error (NVML_ERROR_GPU_IS_LOST, _TIMEOUT),
    so a fault raised beside it cannot be seen: the taint it must carry is the masking one's."""
    faults = NVML_FAULTS if driver == "nvidia" else PCI_FAULTS
    fault = _pick(sorted(faults), pick)
    world.node.host.health(gpu, fault, xid=48)
    world.health.setdefault(gpu, set()).add(fault)
    world.log.append(f"health: {fault} raised on {gpu} ({driver})")
    return fault, _masked(world, gpu, driver) or faults[fault]


def _masked(world: World, gpu: str, driver: str) -> str | None:
    """The taint kind of a lost or hung NVIDIA GPU (every NVML call fails), None otherwise."""
    if driver != "nvidia":
        return None
    h = next((g.get("health") or {} for g in world.node.host.state["gpus"] if g["pf"] == gpu), {})
    return NVML_FAULTS["lost"] if h.get("lost") else NVML_FAULTS["hang"] if h.get("hang") else None


def _resync(world: World, what: str) -> bool:
    err = world.resync()
    world.log.append(f"resync after {what}: {err or 'ok'}")
    return err is None


def sick_published(world: World, gpu: str, kind: str | None) -> list[str]:
    """The GPU's devices as published while it is sick (``kind``: the taint it must carry, None: any)."""
    pool = {d.name: d for d in world.daemon._pool.devices}
    published = _published(world)
    held = _held(world).get(gpu, set())
    bad = [f"{name}, held by a prepared claim on unhealthy GPU {gpu}, is no longer published"
           for name in sorted(held) if name in pool and name not in published]
    mine = sorted(n for n in published if n in pool and pool[n].gpu == gpu)
    for name in mine:
        taints = [t for t in published[name].get("taints", []) if t["key"] in HEALTH_KEYS]
        if world.daemon.kept.taints is not True:
            if name not in held:
                bad.append(f"free device {name} of unhealthy GPU {gpu} is still published (taints dropped)")
            continue
        if not taints or (kind and f"{DEFAULT_DRIVER}/{kind}" not in {t['key'] for t in taints}):
            bad.append(f"device {name} of unhealthy GPU {gpu} is published without its {kind or 'health'} "
                       f"taint: {published[name].get('taints', [])}")
        bad += [f"device {name} of unhealthy GPU {gpu} tainted {t['effect']} (NoSchedule expected)"
                for t in taints if t["effect"] != "NoSchedule"]
    return bad[:6]


def _kept(world: World, gpu: str, vgpus: set[str]) -> list[str]:
    """Every vGPU a claim held on ``gpu`` before the fault still exists (health removes nothing in use)."""
    inv = discover(world.env, world.node.io, node=world.node.node)
    have = {v.id for g in inv.gpus for v in g.vgpus}
    return [f"vGPU {v} a claim holds on unhealthy GPU {gpu} was removed" for v in sorted(vgpus - have)]


@dataclass(frozen=True)
class HealthFault:
    """A GPU reports a fault (``target``: ``any`` GPU, or ``held``: one a prepared claim holds, a VM's
    vGPU); ``flap``: raised, cleared and raised again within the quiet period, a resync after each."""

    pick: int
    fault: int
    target: str = "any"
    flap: bool = False

    def run(self, world: World) -> Checks:
        gpus = _gpus(world)
        held = _held(world)
        pool = sorted(g for g in gpus if g in held) if self.target == "held" else sorted(gpus)
        gpu = _pick(pool, self.pick)
        if gpu is None:
            return Checks()
        vgpus = _vgpus_held(world, gpu)
        fault, kind = _raise(world, gpu, gpus[gpu], self.fault)
        flapping: list[str] = []  # within the quiet period after a clear: still tainted (hysteresis)
        if self.flap:
            for step in ("raised", "cleared"):
                if not _resync(world, f"{fault} {step}"):
                    return Checks()
                if step == "cleared":
                    flapping = sick_published(world, gpu, kind)
                world.health_clock.now += DEFAULT_QUIET_SECONDS / 4
                world.node.host.health(gpu, fault, clear=step == "raised", xid=48)
                world.log.append(f"health: {fault} {'cleared' if step == 'raised' else 'raised again'} on {gpu}")
        if not _resync(world, f"{fault} on {gpu}"):
            return Checks()
        return Checks(problems=flapping + sick_published(world, gpu, kind) + _kept(world, gpu, vgpus))


@dataclass(frozen=True)
class HealthDuringPrepare:
    """A GPU faults while the kubelet's prepare of a new claim on it is in flight: the fault is raised
    and the agent resyncs inside the plugin's gRPC call, before the claim's devices are prepared."""

    picks: tuple[int, ...]
    fault: int

    def run(self, world: World) -> Checks:
        claim = _new_claim(world, self.picks, free=True)
        if claim is None:
            return Checks()
        pool = {d.name: d for d in world.daemon._pool.devices}
        gpu = pool[claim.devices[0]].gpu
        gpus = _gpus(world)
        if gpu not in gpus:
            world.prepare(claim)
            return Checks()
        driver, seen, inner = gpus[gpu], [], world.daemon.driver.prepare
        vgpus = _vgpus_held(world, gpu)

        def prepare(claims):
            world.daemon.driver.prepare = inner  # once: a retry inside the call is not faulted again
            seen.append(_raise(world, gpu, driver, self.fault))
            seen.append(_resync(world, f"a fault during the prepare of {claim.ref.name}"))
            return inner(claims)

        world.daemon.driver.prepare = prepare
        try:
            world.prepare(claim)
        finally:
            world.daemon.driver.prepare = inner
        if not seen or not _resync(world, f"the prepare of {claim.ref.name}"):
            return Checks()
        return Checks(problems=sick_published(world, gpu, seen[0][1]) + _kept(world, gpu, vgpus))


@dataclass(frozen=True)
class HealthRecover:
    """The faults of a sick GPU are cleared; past the quiet period it is healthy again: no health taint,
    its free devices published again (``early``: checked first before the quiet period, still sick)."""

    pick: int
    early: bool = False

    def run(self, world: World) -> Checks:
        gpu = _pick(sorted(world.health), self.pick)
        if gpu is None:
            return Checks()
        for fault in sorted(world.health.pop(gpu)):
            world.node.host.health(gpu, fault, clear=True)
        world.log.append(f"health: faults cleared on {gpu}")
        problems: list[str] = []
        if self.early:
            world.health_clock.now += 1
            if not _resync(world, "the clear, within the quiet period"):
                return Checks()
            if gpu in _gpus(world) and gpu in world.daemon.health.tracker.unhealthy():
                problems += sick_published(world, gpu, None)
        world.health_clock.now += DEFAULT_QUIET_SECONDS + 1
        if not _resync(world, f"the quiet period on {gpu}"):  # the poll sees it quiet: healthy again
            return Checks(problems=problems)
        published = _published(world)
        gpu_of = {d.name: d.gpu for d in world.daemon._pool.devices}
        left = sorted(n for n, d in published.items() if gpu_of.get(n) == gpu
                      and any(t["key"] in HEALTH_KEYS for t in d.get("taints", [])))
        if left:
            problems.append(f"health taints left after recovery (and the quiet period) on {left[:4]}")
        missing = sorted(n for n, g in gpu_of.items() if g == gpu and n not in published)
        if missing:
            problems.append(f"after recovery devices of {gpu} are still withdrawn: {missing[:4]}")
        return Checks(problems=problems)


def kinds(n: st.SearchStrategy) -> list[tuple[int, st.SearchStrategy]]:
    """The health steps with their weights, appended to :func:`tests.campaign.steps.steps`'s kinds."""
    return [
        (2, st.builds(HealthFault, n, n, st.sampled_from(["any", "held"]), st.booleans())),
        (2, st.builds(HealthDuringPrepare, st.tuples(n), n)),
        (3, st.builds(HealthRecover, n, st.booleans())),
    ]
