"""A name the node publishes is a name the CLI takes (issue #36.8).

A user copies a device's ``profile`` (a vGPU type, a MIG-backed vGPU's GPU-instance profile such
as ``1g.5gb``, or a whole GPU's model), a type of its ``vgpuTypes`` or its ``productName`` from
``kubectl get resourceslices`` into ``vgpuctl render``. For every value every preset publishes, in
every DRA layout (time-sliced sizes, MIG placements, both at once, mixed-size placements), the
render is accepted where the CLI asks for that attribute (checked against the catalog, and against
the node's own inventory as ``--inventory``/``--simulate`` check it), and its rendered selectors,
evaluated with real CEL over the published slices, select exactly the devices carrying the value.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from dra_bridge.api.names import DEFAULT_DRIVER, resource_name_for_type
from dra_bridge.pool.devices import PoolPolicy, build_pool
from dra_bridge.pool.slices import build_slices
from dra_bridge.scheduling.cel import SliceDevice, claim_spec_of, request_alternatives, select, slice_devices
from kubevirt_templates.profiles import KnownTypes, check_types
from kubevirt_templates.render import RenderError, render
from mdev_manager import catalog, catalog_placements
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.models import Gpu
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.hostspec import preset_names
from mdev_manager.sim.node import sim_node
from tests.support.cel import classes_by_name
from vgpuctl.commands.render import catalog_types, node_types

D = DEFAULT_DRIVER
#: DRA layouts that publish each kind of device: size slots, MIG placements, both, mixed-size placements
LAYOUTS: dict[str, dict[str, Any]] = {
    "dra": {"all": True, "mode": "dra", "passthrough": True},
    "mig": {"all": True, "mode": "dra", "passthrough": True, "migMode": True},
    "mig-auto": {"all": True, "mode": "dra", "passthrough": True, "migMode": "auto"},
    "mixed-size": {"mode": "dra", "passthrough": True},  # mixedSize on each board with a placement table
}
PRESETS = [p for p in preset_names() if p != "bench-large"]  # bench-large: many copies of the same boards


@cache
def published(preset: str, layout: str) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """(the node's inventory as ``discover -o json`` writes it, the slices the agent publishes)."""
    # a simulated host is some 13,000 files: removed once read (654 of them once filled /dev/shm's inodes)
    with tempfile.TemporaryDirectory(prefix="vgpuctl-names-") as tmp:
        sim = sim_node(Path(tmp), preset)
        entries = [LAYOUTS[layout]]
        if layout == "mixed-size":
            entries = [{**LAYOUTS[layout], "pciAddress": g.address, "mixedSize": _has_placements(g)}
                       for g in discover(sim.env, sim.io, node=sim.node).gpus]
        out = reconcile(sim.env, sim.io, parse_config({"version": "vgpuctl/v1", "layouts": {"default": entries}}))
        assert out.ok, out
        inv = discover(sim.env, sim.io, node=sim.node)
    pool = build_pool(inv, PoolPolicy.default(), D, server_version=(1, 37))
    slices = build_slices(pool, driver=D, node_name=inv.node, pool_name=inv.node, generation=1, server_version=(1, 37))
    return inv.model_dump(mode="json"), tuple(slices)


def _has_placements(gpu: Gpu) -> bool:
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    return board is not None and board.key in catalog_placements.KNOWN


def _str(dev: Mapping[str, Any], name: str) -> str | None:
    v = (dev.get("attributes") or {}).get(name)
    return v.get("string") if v else None


def _devices(slices) -> list[Mapping[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def _tokens(dev: Mapping[str, Any]) -> set[str]:
    return set((_str(dev, "vgpuTypes") or "").split())


def profile_values(slices) -> set[str]:
    """Every value a user may give as a profile: each device's ``profile`` and each type it can be."""
    return {v for d in _devices(slices) for v in {_str(d, "profile"), *_tokens(d)} if v}


def carrying_profile(slices, value: str) -> set[str]:
    """The devices that carry ``value`` as their profile or as a type they can become."""
    return {d["name"] for d in _devices(slices) if _str(d, "profile") == value or value in _tokens(d)}


def carrying_product(slices, value: str) -> set[str]:
    """The whole GPUs of that product (a product claim or class selects whole GPUs)."""
    return {d["name"] for d in _devices(slices) if _str(d, "type") == "passthrough" and _str(d, "productName") == value}


class Selection:
    """Devices selected by a request or a class over one node's slices, each CEL expression evaluated
    once per device (the same selector comes back for many spellings and kinds of render)."""

    def __init__(self, slices) -> None:
        self.devices = slice_devices(slices)
        self._by_exprs: dict[tuple[str, ...], list[SliceDevice]] = {(): self.devices}

    def of(self, expressions: list[str]) -> set[str]:
        """As the scheduler: each expression on the devices the ones before it selected."""
        for i in range(1, len(expressions) + 1):
            key = tuple(expressions[:i])
            if key not in self._by_exprs:
                self._by_exprs[key] = select(self._by_exprs[key[:-1]], [key[-1]])
        return {d.name for d in self._by_exprs[tuple(expressions)]}

    def claim(self, template: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> set[str]:
        """The devices the template's one request (or its one firstAvailable alternative) selects."""
        (alternatives,) = [request_alternatives(r, classes) for r in claim_spec_of(template)["devices"]["requests"]]
        (exprs,) = alternatives.values()
        return self.of(exprs)


@cache
def selection(preset: str, layout: str) -> Selection:
    return Selection(published(preset, layout)[1])


def _render(kind: str, values: dict[str, Any], known: KnownTypes) -> list[dict[str, Any]]:
    """What ``vgpuctl render KIND --set ...`` does with ``values``: check the names, then render."""
    checked, problems = check_types(kind, values, known)
    assert problems == [], problems
    return render(kind, checked)


def node_resources(inventory: dict[str, Any]) -> set[str]:
    """The classic resource of every type the node's GPUs offer (the device plugin names them so)."""
    return {resource_name_for_type(t["name"]) for g in inventory["gpus"] for t in g["types"]}


def _knowns(inventory: dict[str, Any]) -> Iterator[tuple[str, KnownTypes]]:
    yield "catalog", catalog_types()
    yield "node", node_types([inventory], simulated=False)


CASES = [(p, layout) for p in PRESETS for layout in LAYOUTS]


@pytest.fixture(scope="module")
def classes():
    return classes_by_name(render("deviceclasses"))


@pytest.mark.parametrize("preset, layout", CASES)
def test_every_published_profile_renders_a_claim_selecting_exactly_its_devices(preset, layout, classes):
    inventory, slices = published(preset, layout)
    sel = selection(preset, layout)
    values = profile_values(slices)
    vgpu_values = {v for d in _devices(slices) if _str(d, "type") == "vgpu" for v in (_str(d, "profile"), *_tokens(d))}
    assert values
    for where, known in _knowns(inventory):
        for value in sorted(values):
            want = carrying_profile(slices, value)
            assert want
            for given in (value, value.lower()):  # any case, as the CLI takes types
                (tmpl,) = _render("claim-template", {"profile": given}, known)
                assert sel.claim(tmpl, classes) == want, (where, given)
            if value in vgpu_values:  # an alternative of a vGPU request
                (tmpl,) = _render("claim-template", {"first_available": [value]}, known)
                assert sel.claim(tmpl, classes) == want, (where, "first_available", value)


@pytest.mark.parametrize("preset, layout", CASES)
def test_every_published_product_renders_a_passthrough_claim_of_exactly_its_gpus(preset, layout, classes):
    inventory, slices = published(preset, layout)
    sel = selection(preset, layout)
    products = {_str(d, "productName") for d in _devices(slices)} - {None}
    assert products
    for where, known in _knowns(inventory):
        for product in sorted(products):  # type: ignore[type-var]
            (tmpl,) = _render("claim-template", {"passthrough": True, "product": product}, known)
            assert sel.claim(tmpl, classes) == carrying_product(slices, product) != set(), (where, product)


@pytest.mark.parametrize("preset, layout", CASES)
def test_every_published_profile_and_product_renders_a_device_class_of_exactly_its_devices(preset, layout):
    inventory, slices = published(preset, layout)
    sel = selection(preset, layout)
    for where, known in _knowns(inventory):
        for value in sorted(profile_values(slices)):
            for extended in (False, True):
                try:
                    objs = _render("deviceclasses", {"profiles": [value], "extended_resources": extended}, known)
                except AssertionError as exc:
                    # a GPU-instance profile that several MIG-backed types share on these GPUs maps to no one
                    # device-plugin resource: refused, one line naming the types
                    assert extended and "name the vGPU type instead" in str(exc), (where, value, str(exc))
                    continue
                except RenderError as exc:
                    # a short name two boards share (DC-8C: RTX PRO 6000 and 4500) names one resource per board:
                    # without a node's inventory, refused, one line naming both and the fix (#38.4)
                    assert extended and where == "catalog" and len(catalog.namesakes(value)) > 1, (value, str(exc))
                    assert "give the node's inventory" in str(exc), str(exc)
                    continue
                own = [o for o in objs if o["metadata"]["name"] not in (
                    "vgpu.kubevirt.io", "passthrough.vgpu.kubevirt.io")]
                (cls,) = own
                exprs = [s["cel"]["expression"] for s in cls["spec"]["selectors"]]
                assert sel.of(exprs) == carrying_profile(slices, value), (where, value)
                if extended:
                    assert cls["spec"]["extendedResourceName"].startswith("nvidia.com/")
                if extended and where == "node" and cls["metadata"]["name"].startswith("vgpu-"):  # the node's own type's
                    assert cls["spec"]["extendedResourceName"] in node_resources(inventory), (value, cls)


# --------------------------------------------------------------------------- the issue's own commands


def run(capsys, *argv: str) -> tuple[int, str, str]:
    from vgpuctl.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def simdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path / "sims"))
    return tmp_path / "sims"


def test_a_gpu_instance_profile_renders_from_the_command_line(simdir, capsys):
    """`render claim-template --set profile=1g.5gb` (catalog and --simulate mig-node) and the
    per-profile DeviceClass with extended resources: accepted, no VgpuConfig (the placement makes
    its one MIG-backed type), the classic resource that of that type."""
    for argv in (["render", "claim-template", "--set", "profile=1g.5gb"],
                 ["--simulate", "mig-node", "render", "claim-template", "--set", "profile=1G.5GB"]):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert 'profile == "1g.5gb"' in out and "VgpuConfig" not in out and "name: vgpu-1g-5gb" in out
    code, out, err = run(capsys, "render", "deviceclasses", "--set", "extended_resources=true",
                         "--set", "profiles=[1g.5gb]")
    assert code == 0, err
    assert "extendedResourceName: nvidia.com/NVIDIA_A100-1-5C" in out
    code, out, err = run(capsys, "render", "deviceclasses", "--set", "extended_resources=true",
                         "--set", "profiles=[1g.10gb]")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "profiles.1g.10gb: GPU-instance profile 1g.10gb" in err, err
    assert "A100D-1-10C" in err and "H100-1-10C" in err and "name the vGPU type instead" in err
    code, out, err = run(capsys, "--simulate", "mig-node", "render", "deviceclasses", "--set",
                         "extended_resources=true", "--set", "profiles=[1g.10gb]")
    assert code == 0 and "nvidia.com/NVIDIA_H100-1-10C" in out, err  # the node has one type of it


def test_a_gpu_model_as_profile_renders_a_passthrough_claim(simdir, capsys):
    code, out, err = run(capsys, "render", "claim-template", "--set", "profile=GA100 [A100 PCIe 40GB]")
    assert code == 0, err
    assert "passthrough.vgpu.kubevirt.io" in out and 'productName == "GA100 [A100 PCIe 40GB]"' in out


def test_an_unknown_instance_profile_is_still_refused(simdir, capsys):
    code, out, err = run(capsys, "render", "claim-template", "--set", "profile=1g.7gb")
    assert code == 2 and out == "" and "profile: '1g.7gb' is not a vGPU type" in err


def test_render_refusal_is_not_an_assertion():
    with pytest.raises(RenderError):
        render("claim-template", {"profile": "GA100 [A100 PCIe 40GB]"})  # without the CLI's check: no type
