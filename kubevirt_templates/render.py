"""Render the templates: typed input -> context -> jinja2 YAML -> parsed objects.

Every decision (names, CEL expressions, resource names) is made here in Python; the ``.j2``
files only lay the objects out, quoting every value as a JSON string (valid YAML), so no
input can change the structure of what is rendered.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import jinja2
import yaml
from pydantic import BaseModel, ValidationError

from dra_bridge.api.attributes import ATTR_DEVICE_ID
from dra_bridge.api.k8sname import fit_dns_label
from dra_bridge.api.names import profile_of, resource_name_for_pci, resource_name_for_type, type_is_mig_backed
from dra_bridge.api.quantity import format_quantity
from kubevirt_templates.inputs import (
    MAX_FIRST_AVAILABLE,
    ClaimTemplateInput,
    DeviceClassesInput,
    KubeVirtCrInput,
    PassthroughPodInput,
    VmInput,
    classic_type_name,
)
from kubevirt_templates.keys import explain
from kubevirt_templates.names import pci_vendor_selector
from mdev_manager import catalog
from mdev_manager.models import VgpuType
from mdev_manager.names import is_instance_profile

TEMPLATES = Path(__file__).parent / "templates"

FEATURE_GATES_CLASSIC = ["GPU", "HostDevices"]
FEATURE_GATES_DRA = ["GPUsWithDRA", "HostDevicesWithDRA"]
#: KubeVirt 1.9's vGPU live migration (alpha): the gate and the target-side hooks it needs
FEATURE_GATES_VGPU_MIGRATION = ["VGPULiveMigration", "TargetSideMigrationHooks"]


class RenderError(ValueError):
    """Bad input: ``problems`` lists each as ``field: message``."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


# --------------------------------------------------------------------------- jinja


def _q(value: Any) -> str:
    """A scalar as a JSON literal, which YAML reads back unchanged."""
    if isinstance(value, (dict, list)):
        raise TypeError("q: scalars only")
    return json.dumps(value, ensure_ascii=False)


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
)
_env.filters["q"] = _q


def _render(template_file: str, **context: Any) -> list[dict[str, Any]]:
    text = _env.get_template(template_file).render(**context)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def cel_string(s: str) -> str:
    """A CEL string literal."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --------------------------------------------------------------------------- CEL selectors


def class_expression(driver: str, kind: str) -> str:
    d = cel_string(driver)
    return f"device.driver == {d} && device.attributes[{d}].type == {cel_string(kind)}"


def profile_expression(driver: str, profile: str) -> str:
    """Devices that can be a vGPU of type ``profile``: a size slot its type shares with the other
    series of its size, or a MIG placement (``vgpuTypes``: the short names, space-separated).
    A GPU-instance profile (``1g.5gb``, what a MIG-backed vGPU publishes as its ``profile``)
    selects the placements of that profile, whatever vGPU type they carry."""
    if is_instance_profile(profile):
        return f"device.attributes[{cel_string(driver)}].profile == {cel_string(profile)}"
    return f"device.attributes[{cel_string(driver)}].vgpuTypes.contains({cel_string(' ' + profile + ' ')})"


def board_expression(driver: str, type_name: str) -> str | None:
    """The devices of the board whose type ``type_name`` (a full name) is, by PCI device id, where
    another board has a type of its short name (``DC-2-16Q``: RTX PRO 6000 and 4500): a class mapped
    to that board's device-plugin resource then selects that board's devices only. None elsewhere."""
    shared = catalog.namesakes(profile_of(type_name))
    board = next((b for b, t in shared if t.name == type_name), None)
    if board is None or len(shared) < 2:
        return None
    device_id = "0x" + board.device_id.lower().removeprefix("0x").zfill(4)
    return f"device.attributes[{cel_string(driver)}].{ATTR_DEVICE_ID} == {cel_string(device_id)}"


def profile_type(profile: str) -> str | None:
    """The vGPU type a claim for ``profile`` asks prepare to make (its VgpuConfig): the type itself;
    none for a GPU-instance profile, whose placement makes the one MIG-backed type it carries."""
    return None if is_instance_profile(profile) else profile


def vgpu_config(driver: str, requests: list[str], profile: str | None, *, resource: str | None = None) -> dict[str, Any]:
    """An opaque VgpuConfig (dra_bridge/kubeletplugin/claimconfig.py): the type a slot becomes
    and/or the classic resource its devices stand for (prepare sets virt-launcher's variable)."""
    params = {k: v for k, v in (("vgpuType", profile), ("resourceName", resource)) if v}
    return {"requests": requests, "opaque": {"driver": driver, "parameters": {
        "apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", **params}}}


def min_memory_expression(driver: str, quantity: str) -> str:
    d = cel_string(driver)
    return (f"has(device.capacity[{d}].memory) && "
            f"device.capacity[{d}].memory.compareTo(quantity({cel_string(quantity)})) >= 0")


def product_expression(driver: str, product: str) -> str:
    return f"device.attributes[{cel_string(driver)}].productName == {cel_string(product)}"


# --------------------------------------------------------------------------- DeviceClasses


def _config(driver: str, *, vgpu_type: str | None = None, resource: str | None = None) -> list[dict[str, Any]]:
    """A class's config: its VgpuConfig, none when there is nothing to say."""
    if not (vgpu_type or resource):
        return []
    return [{"opaque": vgpu_config(driver, [], vgpu_type, resource=resource)["opaque"]}]


def render_deviceclasses(v: DeviceClassesInput) -> list[dict[str, Any]]:
    """The driver's classes; with ``extended_resources``, each mapped to its classic resource name
    (KEP-5004) so device-plugin-era VMs and pods are allocated from the same counters."""
    ext = v.extended_resources
    vfio = f"{v.resource_domain}/{v.vfio_resource}" if ext else None
    classes = [
        {"name": v.vgpu_class, "selectors": [class_expression(v.driver, "vgpu")], "config": [], "extended": None},
        {"name": v.passthrough_class, "selectors": [class_expression(v.driver, "passthrough")],
         "config": _config(v.driver, resource=vfio), "extended": vfio},
    ]
    first: dict[str, str] = {}  # a class per short name (what devices publish), in the order given
    for given in v.profiles:
        first.setdefault(profile_of(given), given)
    for p, given in first.items():  # its resource named after the full name, where one is given
        full = classic_type_name(given, "profiles") if ext else None
        res = resource_name_for_type(full, v.resource_domain) if full else None
        selectors = [class_expression(v.driver, "vgpu"), profile_expression(v.driver, p)]
        if full and (board := board_expression(v.driver, full)):
            selectors.append(board)
        classes.append({"name": fit_dns_label("vgpu-", p, ""), "selectors": selectors,
                        "config": _config(v.driver, vgpu_type=profile_type(p), resource=res), "extended": res})
    for product in dict.fromkeys(v.products):
        res = resource_name_for_pci(product, v.resource_domain) if ext else None
        classes.append({"name": fit_dns_label("gpu-passthrough-", product, ""),
                        "selectors": [class_expression(v.driver, "passthrough"), product_expression(v.driver, product)],
                        "config": _config(v.driver, resource=res), "extended": res})
    return _render("deviceclasses.yaml.j2", classes=classes)


# --------------------------------------------------------------------------- ResourceClaimTemplates


def claim_template_name(v: ClaimTemplateInput) -> str:
    if v.name:
        return v.name
    if v.passthrough:
        return fit_dns_label("gpu-passthrough-", v.product, "") if v.product else "gpu-passthrough"
    if v.profile:
        return fit_dns_label("vgpu-", v.profile, "")
    if v.min_memory:
        return fit_dns_label("vgpu-min-", v.min_memory, "")
    if v.gpu_memory:
        return fit_dns_label("vgpu-memory-", f"{v.gpu_memory}mi", "")
    if v.gpu_fraction:
        return fit_dns_label("vgpu-fraction-", f"{round(v.gpu_fraction * 100)}pct-{v.product}", "")
    return fit_dns_label("vgpu-", "-or-".join(v.first_available or []), "")


def claim_request_name(v: ClaimTemplateInput) -> str:
    return v.request_name or ("gpu" if v.passthrough else "vgpu")


def _template_context(v: ClaimTemplateInput) -> dict[str, Any]:
    t: dict[str, Any] = {
        "name": claim_template_name(v),
        "namespace": v.namespace,
        "request": claim_request_name(v),
        "device_class": v.passthrough_class if v.passthrough else v.vgpu_class,
        "selectors": [],
        "alternatives": [],
        "config": [],
    }
    if v.passthrough and v.product:
        t["selectors"] = [product_expression(v.driver, v.product)]
    elif v.profile:
        t["selectors"] = [profile_expression(v.driver, v.profile)]
        t["config"] = [vgpu_config(v.driver, [t["request"]], v.profile)] if profile_type(v.profile) else []
    elif v.min_memory:
        t["selectors"] = [min_memory_expression(v.driver, v.min_memory)]
    elif v.gpu_memory or v.gpu_fraction:
        t["alternatives"] = memory_alternatives(v)
    elif v.first_available:
        names = [fit_dns_label("", p, "") for p in v.first_available]
        if len(set(names)) != len(names):
            raise RenderError(f"first_available: {v.first_available} give the same subrequest names {names}")
        t["alternatives"] = [
            {"name": n, "device_class": v.vgpu_class, "selectors": [profile_expression(v.driver, p)]}
            for n, p in zip(names, v.first_available, strict=False)
        ]
        t["config"] = [vgpu_config(v.driver, [f"{t['request']}/{n}"], p)
                       for n, p in zip(names, v.first_available, strict=False) if profile_type(p)]
    return t


def memory_alternatives(v: ClaimTemplateInput) -> list[dict[str, Any]]:
    """KAI Scheduler's ``gpu-memory`` / ``gpu-fraction`` as a DRA request: the first available of
    the framebuffer sizes that hold it, smallest first (the catalog's sizes, of ``product`` if given),
    each alternative any vGPU with at least the asked memory and at most that size. A MIG-backed
    vGPU (a GPU instance's memory, e.g. 4864Mi for 1g.5gb) falls in the size its name gives."""
    boards = [b for b in catalog.BOARDS.values() if v.product is None or b.product_name == v.product]
    if not boards:
        raise RenderError(f"product: {v.product!r} is not a GPU of vgpuctl's catalog; name one of "
                          + ", ".join(sorted({b.product_name for b in catalog.BOARDS.values() if b.product_name})))
    if v.gpu_memory:
        need = v.gpu_memory
    elif v.gpu_fraction:
        need = max(1, math.ceil(v.gpu_fraction * max(b.framebuffer_mib for b in boards)))
    else:
        raise RenderError("memory alternatives: give gpu_memory or gpu_fraction")
    sizes = sorted({t.fb_mib for b in boards for t in b.types if t.fb_mib and t.fb_mib >= need})
    if not sizes:
        raise RenderError(f"{'gpu_memory' if v.gpu_memory else 'gpu_fraction'}: no vGPU type has {need} MiB of "
                          "framebuffer or more" + (f" on {v.product}" if v.product else ""))
    d = cel_string(v.driver)
    base = [min_memory_expression(v.driver, f"{need}Mi")] + ([product_expression(v.driver, v.product)]
                                                             if v.product else [])
    out = []
    for mib in sizes[:MAX_FIRST_AVAILABLE]:
        size = format_quantity(Fraction(mib << 20))  # 6Gi, 1536Mi
        out.append({"name": f"mem-{size.lower()}", "device_class": v.vgpu_class, "selectors": [" && ".join(
            base + [f"device.capacity[{d}].memory.compareTo(quantity({cel_string(size)})) <= 0"])]})
    return out


def render_claim_template(v: ClaimTemplateInput) -> list[dict[str, Any]]:
    return _render("resourceclaimtemplate.yaml.j2", t=_template_context(v))


# --------------------------------------------------------------------------- VirtualMachine


def default_user_data(v: VmInput) -> str:
    doc: dict[str, Any] = {}
    if v.password:
        doc["password"] = v.password
        doc["chpasswd"] = {"expire": False}
    doc["ssh_pwauth"] = bool(v.password)
    if v.ssh_authorized_keys:
        doc["ssh_authorized_keys"] = list(v.ssh_authorized_keys)
    doc["runcmd"] = ["lspci -nnk | grep -i -A3 nvidia > /var/log/vgpuctl-gpus.txt || true"]
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False)


def display_options(display: bool | None, ramfb: bool | None, count: int) -> list[tuple[bool | None, bool | None]]:
    """(``display.enabled``, ``display.ramFB.enabled``) of each of ``count`` vGPUs; None leaves it out.

    KubeVirt's VMI admitter refuses "configuring multiple displays with ramfb" (validateMDEVRamFB in
    pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go): it counts every vGPU
    whose ``virtualGPUOptions.display`` is set, not disabled, and whose ``ramFB`` is absent or
    enabled. So the boot framebuffer goes to the first vGPU only: with ``display: true`` every later
    vGPU shows a display with ``ramFB.enabled: false``; with display unset, later vGPUs carry no
    options (KubeVirt's default, which gives display and ramfb to the first vGPU alone).
    """
    out: list[tuple[bool | None, bool | None]] = []
    for k in range(count):
        if k == 0:
            out.append((display, ramfb))
        elif display is None:
            out.append((None, None))
        else:
            out.append((display, False if display else ramfb))
    return out


def _dra_names(v: VmInput) -> dict[str, Any]:
    return {"driver": v.driver, "vgpu_class": v.vgpu_class, "passthrough_class": v.passthrough_class}


def render_vm(v: VmInput) -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = []
    host_devices: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    templates: list[dict[str, Any]] = []
    k = 0
    if v.mode == "classic":
        for profile, n in v.gpus.items():
            resource = resource_name_for_type(classic_type_name(profile), v.resource_domain)
            for _ in range(n):
                k += 1
                gpus.append({"name": f"gpu{k}", "device_name": resource})
        if v.passthrough:
            resource = (v.passthrough if "/" in v.passthrough and "[" not in v.passthrough
                        else resource_name_for_pci(v.passthrough, v.resource_domain))
            for i in range(v.passthrough_count):
                host_devices.append({"name": f"hostgpu{i + 1}", "device_name": resource})
    else:
        # One claim per device: KubeVirt reads exactly one device per request. Templates are
        # shared per profile, so VMs asking for the same profile reuse them.
        seen: set[str] = set()
        for profile, n in v.gpus.items():
            ct = ClaimTemplateInput(namespace=v.namespace, profile=profile_of(profile), **_dra_names(v))
            ctx = _template_context(ct)
            if ctx["name"] not in seen:
                seen.add(ctx["name"])
                templates += _render("resourceclaimtemplate.yaml.j2", t=ctx)
            for _ in range(n):
                k += 1
                claim = f"gpu{k}"
                claims.append({"name": claim, "template": ctx["name"]})
                gpus.append({"name": f"gpu{k}", "device_name": None, "claim": claim, "request": ctx["request"]})
        if v.passthrough:
            ct = ClaimTemplateInput(namespace=v.namespace, passthrough=True, product=v.passthrough, **_dra_names(v))
            ctx = _template_context(ct)
            templates += _render("resourceclaimtemplate.yaml.j2", t=ctx)
            for i in range(v.passthrough_count):
                claim = f"hostgpu{i + 1}"
                claims.append({"name": claim, "template": ctx["name"]})
                host_devices.append({"name": claim, "device_name": None, "claim": claim, "request": ctx["request"]})
    for g, (display, ramfb) in zip(gpus, display_options(v.display, v.ramfb, len(gpus)), strict=False):
        g["display"], g["ramfb"] = display, ramfb
    vm = _render(
        "virtualmachine.yaml.j2",
        vm=v,
        gpus=gpus,
        host_devices=host_devices,
        claims=claims,
        user_data=v.user_data if v.user_data is not None else default_user_data(v),
    )
    return templates + vm


# --------------------------------------------------------------------------- KubeVirt CR


def _wanted(ref_list: list[str] | None, t: VgpuType) -> bool:
    if ref_list is None:
        return True
    refs = {r.lower() for r in ref_list}
    return bool(refs & {t.id.lower(), t.name.lower(), t.short_name.lower()})


def permitted_host_devices(v: KubeVirtCrInput) -> tuple[list[dict[str, str]], list[dict[str, str]], list[str]]:
    """(pciHostDevices, mediatedDevices, warnings) for every GPU of every inventory, in the
    order the inventories list GPUs and their types, without duplicates."""
    pci: dict[tuple[str, str], dict[str, str]] = {}
    mdev: dict[str, dict[str, str]] = {}
    warnings: list[str] = []
    matched: set[str] = set()
    for inv in v.inventories:
        for gpu in inv.gpus:
            domain = v.resource_domain
            if v.passthrough:
                entry = {"selector": pci_vendor_selector(gpu.vendor_id, gpu.device_id),
                         "resource": resource_name_for_pci(gpu.product_name, domain, gpu.device_id)}
                pci.setdefault((entry["selector"], entry["resource"]), entry)
            if not v.vgpus:
                continue
            vf = gpu.vfs[0] if gpu.vfs else None
            for t in gpu.types:
                if not _wanted(v.types, t):
                    continue
                matched.update({t.id.lower(), t.name.lower(), t.short_name.lower()})
                if type_is_mig_backed(t) and not v.include_mig_backed:
                    continue
                resource = resource_name_for_type(t.name, domain)
                if t.framework == "vendor-vfio":
                    # vendor-specific VFIO: a VF carrying the type is passed through as a PCI device
                    src = vf or gpu
                    entry = {"selector": pci_vendor_selector(src.vendor_id, src.device_id), "resource": resource}
                    pci.setdefault((entry["selector"], entry["resource"]), entry)
                else:
                    prev = mdev.get(t.name)
                    if prev and prev["resource"] != resource:
                        warnings.append(f"type {t.name!r} maps to {prev['resource']} and {resource}")
                    mdev.setdefault(t.name, {"selector": t.name, "resource": resource})
    for ref in v.types or []:
        if ref.lower() not in matched:
            warnings.append(f"types: {ref!r} is offered by no GPU of the inventories")
    return list(pci.values()), list(mdev.values()), warnings


def render_kubevirt_cr(v: KubeVirtCrInput) -> list[dict[str, Any]]:
    pci, mdev, warnings = permitted_host_devices(v) if v.classic else ([], [], [])
    if warnings:
        raise RenderError(warnings)
    gates: list[str] = []
    for g in [*v.extra_feature_gates, *(FEATURE_GATES_CLASSIC if v.classic else ["HostDevices"]),
              *(FEATURE_GATES_DRA if v.dra else []), *(FEATURE_GATES_VGPU_MIGRATION if v.vgpu_live_migration else [])]:
        if g not in gates:
            gates.append(g)
    return _render("kubevirt.yaml.j2", cr=v, feature_gates=gates, pci=pci, mdev=mdev)


# --------------------------------------------------------------------------- Pod


def render_passthrough_pod(v: PassthroughPodInput) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    template = v.claim_template
    if template is None:
        ct = ClaimTemplateInput(namespace=v.namespace, passthrough=True, product=v.product,
                                driver=v.driver, vgpu_class=v.vgpu_class, passthrough_class=v.passthrough_class)
        ctx = _template_context(ct)
        template = ctx["name"]
        out += _render("resourceclaimtemplate.yaml.j2", t=ctx)
    return out + _render("pod-passthrough.yaml.j2", pod=v, template=template)


# --------------------------------------------------------------------------- entry point

KINDS: dict[str, tuple[type[BaseModel], Callable[[Any], list[dict[str, Any]]]]] = {
    "vm": (VmInput, render_vm),
    "kubevirt-cr": (KubeVirtCrInput, render_kubevirt_cr),
    "deviceclasses": (DeviceClassesInput, render_deviceclasses),
    "claim-template": (ClaimTemplateInput, render_claim_template),
    "passthrough-pod": (PassthroughPodInput, render_passthrough_pod),
}
ALIASES = {
    "virtualmachine": "vm",
    "kubevirt": "kubevirt-cr",
    "deviceclass": "deviceclasses",
    "resourceclaimtemplate": "claim-template",
    "claimtemplate": "claim-template",
    "pod": "passthrough-pod",
}


def canonical_kind(kind: str) -> str:
    k = kind.strip().lower()
    k = ALIASES.get(k, k)
    if k not in KINDS:
        raise RenderError(f"kind: {kind!r} is not a template; choose one of {', '.join(KINDS)}")
    return k


def parse_values(kind: str, values: Mapping[str, Any] | BaseModel | None) -> BaseModel:
    """The typed input of ``kind`` from ``values``; RenderError lists every problem."""
    model, _ = KINDS[canonical_kind(kind)]
    if isinstance(values, model):
        return values
    if isinstance(values, BaseModel):
        values = values.model_dump()
    try:
        return model.model_validate(dict(values or {}))
    except ValidationError as exc:
        raise RenderError(explain(exc.errors(), model, canonical_kind(kind))) from None


def render(kind: str, values: Mapping[str, Any] | BaseModel | None = None) -> list[dict[str, Any]]:
    """Render ``kind`` (vm, kubevirt-cr, deviceclasses, claim-template, passthrough-pod) from
    ``values`` (a dict or the kind's input model) into Kubernetes/KubeVirt objects."""
    k = canonical_kind(kind)
    v = parse_values(k, values)
    return KINDS[k][1](v)


def render_yaml(objects: list[dict[str, Any]]) -> str:
    """Objects as multi-document YAML (multi-line strings as literal blocks)."""
    return "".join("---\n" + yaml.dump(o, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=4096) for o in objects)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.Node:
    if "\n" in s and not any(line != line.rstrip() for line in s.splitlines()):
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", s)


_Dumper.add_representer(str, _str)


__all__ = [
    "ALIASES",
    "KINDS",
    "RenderError",
    "board_expression",
    "canonical_kind",
    "class_expression",
    "display_options",
    "min_memory_expression",
    "parse_values",
    "permitted_host_devices",
    "product_expression",
    "profile_expression",
    "render",
    "render_yaml",
]
