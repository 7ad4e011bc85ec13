"""Requests by memory, as KAI Scheduler's users write them (``gpu-memory`` MiB, ``gpu-fraction``):
a claim template whose alternatives are the framebuffer sizes that hold the request, smallest first,
so the scheduler model hands out the smallest fitting vGPU, and falls back to the next size when
the smaller ones are taken."""

from __future__ import annotations

import pytest

from dra_bridge.scheduling.allocator import Allocator
from dra_bridge.scheduling.selectors import default_selectors
from kubevirt_templates.render import RenderError, render
from tests.support.cel import catalog_slices
from tests.support.dra import schema_validate


def claim_from(template: dict, name: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": name}, "spec": template["spec"]["spec"]}


@pytest.fixture
def alloc():
    classes = [o for o in render("deviceclasses") if o["kind"] == "DeviceClass"]
    return Allocator(catalog_slices("default", (1, 37)), classes, default_selectors())


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_the_template_is_valid_and_lists_sizes_smallest_first(version):
    (t,) = render("claim-template", {"gpu_memory": 6000})
    schema_validate(t, version)
    alts = t["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    names = [a["name"] for a in alts]
    assert names[0] == "mem-6gi" and len(names) <= 8
    sizes = [int(n[4:-2]) for n in names]
    assert sizes == sorted(sizes) and all(s >= 6 for s in sizes)
    assert t["metadata"]["name"] == "vgpu-memory-6000mi"


def test_the_smallest_fitting_vgpu_is_allocated_then_the_next_size(alloc):
    (t,) = render("claim-template", {"gpu_memory": 6000})
    got = []
    for i in range(9):
        node, (allocation,) = alloc.allocate([claim_from(t, f"c{i}")])
        got.append(allocation["devices"]["results"][0]["device"])
    # the L40S's 6 GiB vGPUs first (the smallest size holding 6000 MiB; 8 fill its 48 GiB), then the
    # next size, 8 GiB (no board of the node has a 7 GiB type)
    assert got[:8] == [f"gpu-3-vgpu-6gb-{k}" for k in range(8)], got
    assert "-vgpu-8gb-" in got[8], got


def test_a_fraction_of_an_l40s(alloc):
    (t,) = render("claim-template", {"gpu_fraction": 0.25, "product": "AD102GL [L40S]"})
    alts = t["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert alts[0]["name"] == "mem-12gi"  # a quarter of 48 GiB
    assert all('productName == "AD102GL [L40S]"' in a["selectors"][0]["cel"]["expression"] for a in alts)
    node, (allocation,) = alloc.allocate([claim_from(t, "frac")])
    assert "-vgpu-12gb-" in allocation["devices"]["results"][0]["device"]


def test_requests_nothing_can_hold_are_refused_with_the_field():
    with pytest.raises(RenderError, match="gpu_memory: no vGPU type has 999999 MiB"):
        render("claim-template", {"gpu_memory": 999999})
    with pytest.raises(RenderError, match="gpu_fraction: a fraction of which GPU"):
        render("claim-template", {"gpu_fraction": 0.5})
    with pytest.raises(RenderError, match="product: 'NoSuch' is not a GPU of vgpuctl's catalog"):
        render("claim-template", {"gpu_memory": 1024, "product": "NoSuch"})
