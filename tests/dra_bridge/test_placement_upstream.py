"""Mixed-size and MIG placements on Kubernetes' own allocator (issue #39.1): on every supported
minor, k8s.io/dynamic-resource-allocation of that minor, given the slices the agent publishes to a
server of that minor (with the gates that keep counters, and groups on 1.37), allocates a set of
placement devices at once exactly when the GPU can hold them: for mixed-size boards when their slot
ranges are disjoint, for MIG when the simulated NVML creates every GPU instance; the whole GPU
with nothing else. The model's ``co_allocatable`` is asked the same. Sampled sets (the exhaustive
proofs on the model are in test_mixed_dra, test_mig_dra and test_placement_counters). One allocator
process per minor; where Go is absent the model stands in, saying so (a ``ModelFallback``)."""

from __future__ import annotations

import itertools
import random

import pytest

from dra_bridge.pool.devices import co_allocatable
from dra_bridge.pool.slices import build_slices
from mdev_manager.discovery import discover
from mdev_manager.host.nvml import Mig, NvmlError
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.nvml import SimNvml
from tests.dra_bridge import test_mig_dra as mig
from tests.dra_bridge import test_mixed_dra as mixed
from tests.support.dra import make_node
from tests.support.upstream_allocator import MINORS, CoAllocation, keeping_counters, real_or_model

pytestmark = pytest.mark.go


def probe(up, node, pool, version, gpu: str) -> CoAllocation:
    slices = build_slices(pool, driver="vgpu.kubevirt.io", node_name=node.node, pool_name=node.node, generation=1,
                          server_version=version)
    names = {d.name for d in pool.devices if d.gpu == gpu}
    return CoAllocation(up, slices, node.node, keeping_counters(f"1.{version[1]}"), devices=names)


def creatable(nvml: Mig, address: str, chosen: list) -> bool:
    """Whether the simulated NVML creates every chosen device's GPU instance (then destroys them)."""
    made = []
    try:
        for d in chosen:
            made.append(nvml.create(address, d.gpu_instance_profile, d.placement.start, d.placement.size))
        return True
    except NvmlError:
        return False
    finally:
        for gi in made:
            nvml.destroy(address, gi)


@pytest.fixture(scope="module")
def mixed_node(tmp_path_factory):
    n = make_node(tmp_path_factory.mktemp("mixed"), "mixed-node", prepare_gpus=False)
    assert reconcile(n.env, n.io, mixed.LAYOUT, node=n.node).matches
    return n


@pytest.fixture(scope="module")
def mig_node(tmp_path_factory):
    n = make_node(tmp_path_factory.mktemp("mig"), "mig-node", prepare_gpus=False)
    assert reconcile(n.env, n.io, mig.MIG_DRA, node=n.node).matches
    return n


@pytest.mark.parametrize("minor", MINORS)
def test_mixed_size_placements_are_allocated_together_exactly_when_disjoint(mixed_node, minor):
    up = real_or_model(minor)
    version = (1, int(minor.split(".")[1]))
    pool = mixed.pool_of(mixed_node, version=version)
    rng = random.Random(minor)
    for gpu, board in mixed.BOARDS.items():
        co = probe(up, mixed_node, pool, version, gpu)
        devs = mixed.placed(pool, gpu)
        whole = next(d for d in pool.devices if d.gpu == gpu and d.kind == "passthrough")
        pairs = list(itertools.combinations(devs, 2))
        apart = [p for p in pairs if mixed.disjoint(mixed.span(p[0]), mixed.span(p[1]))]
        over = [p for p in pairs if p not in apart]
        for a, b in rng.sample(apart, 12) + rng.sample(over, 12):
            want = mixed.disjoint(mixed.span(a), mixed.span(b))
            assert co([a.name, b.name]) == want == co_allocatable(pool, [a.name, b.name]), (board, a.name, b.name)
        assert co([whole.name])
        assert not any(co([whole.name, d.name]) for d in rng.sample(devs, 6)), board
        for _ in range(4):  # random maximal disjoint families: the GPU full
            chosen: list = []
            for d in rng.sample(devs, len(devs)):
                if all(mixed.disjoint(mixed.span(d), mixed.span(c)) for c in chosen):
                    chosen.append(d)
            assert co([d.name for d in chosen]), (board, [d.name for d in chosen])
            extra = next(d for d in devs if d not in chosen)
            assert not co([d.name for d in chosen] + [extra.name]), (board, extra.name)
        if up is not None:
            assert co.asked > 30


@pytest.mark.parametrize("minor", MINORS)
def test_mig_placements_are_allocated_together_exactly_when_nvml_creates_them(mig_node, minor):
    up = real_or_model(minor)
    version = (1, int(minor.split(".")[1]))
    pool = mig.pool_of(mig_node, version=version)
    rng = random.Random(minor)
    for gpu_index in (1, 2):  # the A100 and the H100
        gpu = discover(mig_node.env, mig_node.io).gpus[gpu_index]
        co = probe(up, mig_node, pool, version, gpu.address)
        devices = [d for d in pool.devices if d.gpu == gpu.address]
        placements = [d for d in devices if d.placement is not None]
        nvml = Mig(SimNvml(mig._InMemoryHost(mig_node.host.state, gpu.address)))
        accepted = refused = 0
        for _ in range(6):  # random walks: grow a set device by device until the GPU is full
            chosen: list = []
            for d in rng.sample(placements, len(placements)):
                want = creatable(nvml, gpu.address, [*chosen, d])
                names = [x.name for x in [*chosen, d]]
                assert co(names) == want == co_allocatable(pool, names), names
                if want:
                    chosen.append(d)
                    accepted += 1
                else:
                    refused += 1
                if refused > 8 * (accepted + 1):
                    break
        whole = next(d for d in devices if d.kind == "passthrough")
        assert co([whole.name]) and not any(co([whole.name, d.name]) for d in rng.sample(placements, 4))
        assert accepted >= 6 and refused >= 6, (accepted, refused)


def test_without_the_program_the_model_stands_in_saying_so_and_ci_fails(monkeypatch):
    from tests.support import upstream_allocator as ua

    monkeypatch.setattr(ua, "why_unavailable", lambda minor: "Go is not installed")
    monkeypatch.delenv("CI", raising=False)
    with pytest.warns(ua.ModelFallback, match="Kubernetes 1.34: the Python scheduler model stands in .*Go is not"):
        assert ua.real_or_model("1.34") is None
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the upstream allocator: Go is not installed"):
        ua.real_or_model("1.34")
