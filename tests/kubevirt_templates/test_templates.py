"""kubevirt_templates: typed inputs, rendered objects valid against KubeVirt's and Kubernetes'
schemas, and CEL selectors that pick exactly the intended devices of a catalog node."""

from __future__ import annotations

import copy
import json
import os
import threading
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dra_bridge.api.names import resource_env_var, resource_name_for_pci, resource_name_for_type
from dra_bridge.api.quantity import parse_quantity
from dra_bridge.scheduling import cel as kcel
from kubevirt_templates import (
    ClaimTemplateInput,
    KubeVirtCrInput,
    RenderError,
    VmInput,
    render,
    render_yaml,
)
from kubevirt_templates.names import pci_vendor_selector
from kubevirt_templates.validate import (
    ENV_SCHEMA,
    KubeVirtSchema,
    KubeVirtSchemaError,
    KubeVirtSchemaMissing,
    admission_problems,
    is_kubevirt,
    kubevirt_problems,
    load_schema,
    validate_kubevirt,
)
from tests.support.cel import (
    DRIVER,
    catalog_inventory,
    catalog_pool,
    catalog_slices,
    claim_selection,
    classes_by_name,
    foreign_slice,
    selected_names,
)
from tests.support.k8sschema import kubernetes_problems
from vgpuctl.commands.render import load_values, parse_set

K8S_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
GiB = Fraction(2**30)

#: Where a checkout next to ../shared finds KubeVirt's swagger file (CI always has it).
SHARED_SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "schemas" / "kubevirt-openapi.json"


def kubevirt_schema_path() -> Path | None:
    """$VGPUCTL_KUBEVIRT_OPENAPI, else ../shared/schemas/ next to the repository, else None."""
    env = os.environ.get(ENV_SCHEMA)
    if env:
        return Path(env)
    return SHARED_SCHEMA if SHARED_SCHEMA.is_file() else None


def kubevirt_schema() -> KubeVirtSchema:
    """KubeVirt's schema; the calling test is skipped, saying why, when there is none."""
    path = kubevirt_schema_path()
    if path is None:
        pytest.skip(f"KubeVirt OpenAPI schema not found: set ${ENV_SCHEMA} or provide {SHARED_SCHEMA}")
    return load_schema(path)


def inventory_dict() -> dict:
    return catalog_inventory().model_dump(mode="json")


def assert_valid(objects: list[dict]) -> None:
    """Every KubeVirt object validates against KubeVirt's OpenAPI, every other one against the
    strict Kubernetes schemas of 1.34 to 1.37, and every CEL selector compiles."""
    assert objects
    for o in objects:  # the Kubernetes objects first: a missing KubeVirt schema skips only the rest
        if not is_kubevirt(o):
            problems = kubernetes_problems(o, K8S_VERSIONS)
            assert problems == [], f"{o['kind']} {o['metadata'].get('name')}: {problems}"
        for expr in kcel.expressions_in(o):
            kcel.compile_selector(expr)
    for o in objects:  # what KubeVirt's admission refuses beyond the schema (ramfb on one vGPU only)
        assert admission_problems(o) == [], o
    for o in objects:
        if is_kubevirt(o):
            problems = kubevirt_problems(o, kubevirt_schema())
            assert problems == [], f"{o['kind']} {o['metadata'].get('name')}: {problems}"


# Sample inputs of every kind (each must render valid objects).
SAMPLES = {
    "vm-classic": ("vm", {"name": "vgpu-vm", "gpus": {"T4-1Q": 2}, "display": True, "ramfb": True}),
    "vm-classic-displays": ("vm", {"name": "vdi", "gpus": {"T4-1Q": 2, "T4-2Q": 1}, "display": True}),
    "vm-dra-displays": ("vm", {"name": "vdi-dra", "mode": "dra", "gpus": {"A100-4C": 2}, "display": True,
                               "ramfb": True}),
    "vm-classic-full-name": ("vm", {"name": "a100-vm", "gpus": {"NVIDIA A100-4C": 1}, "display": False}),
    "vm-classic-passthrough": ("vm", {"name": "pt-vm", "passthrough": "TU104GL [Tesla T4]"}),
    "vm-classic-resource": ("vm", {"name": "pt-vm2", "passthrough": "nvidia.com/TU104GL_TESLA_T4"}),
    "vm-dra": ("vm", {"name": "dra-vm", "mode": "dra", "gpus": {"A100-4C": 1, "L40S-8Q": 2},
                      "display": True, "ramfb": False, "ssh_authorized_keys": ["ssh-ed25519 AAAA demo"]}),
    "vm-dra-passthrough": ("vm", {"name": "dra-pt", "mode": "dra", "passthrough": "TU104GL [Tesla T4]",
                                  "namespace": "vms", "memory": "8Gi", "cpus": 4, "password": "s3cret"}),
    "kubevirt-classic": ("kubevirt-cr", {"inventories": None}),
    "kubevirt-both": ("kubevirt-cr", {"inventories": None, "dra": True, "extra_feature_gates": ["LiveMigration"]}),
    "kubevirt-dra-only": ("kubevirt-cr", {"classic": False, "dra": True}),
    "deviceclasses": ("deviceclasses", {}),
    "claim-profile": ("claim-template", {"profile": "A100-4C"}),
    "claim-memory": ("claim-template", {"min_memory": "8Gi"}),
    "claim-first": ("claim-template", {"first_available": ["A100-8C", "L40S-8Q", "T4-8Q"]}),
    "claim-passthrough": ("claim-template", {"passthrough": True, "product": "TU104GL [Tesla T4]"}),
    "pod": ("passthrough-pod", {}),
    "pod-product": ("passthrough-pod", {"product": "AD102GL [L40S]", "name": "dpdk"}),
}


def sample(key: str) -> tuple[str, dict]:
    kind, values = SAMPLES[key]
    values = dict(values)
    if "inventories" in values:
        values["inventories"] = [inventory_dict()]
    return kind, values


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_every_sample_renders_valid_objects(key):
    kind, values = sample(key)
    assert_valid(render(kind, values))


# --------------------------------------------------------------------------- the KubeVirt validator


def _vm() -> dict:
    return render("vm", {"name": "v", "gpus": {"T4-1Q": 1}})[-1]


def _set(obj: dict, path: str, value) -> dict:
    node = obj
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return obj


@pytest.mark.parametrize("path, value, words", [
    ("spec.template.spec.domain.devices.gpus.0.bogus", 1, "bogus"),          # unknown field
    ("spec.template.spec.domain.devices.gpus.0.virtualGPUOptions", {"display": {"ramfb": True}}, "ramfb"),
    ("spec.template.spec.domain.devices.interfaces.0.masquerade", {"x": 1}, "x"),  # property-less struct
    ("spec.template.spec.domain.cpu.cores", "two", "not of type"),           # wrong type
    ("spec.runStrategy", 3, "not of type"),
    ("spec.template.spec.domain.devices.gpus.0", {"deviceName": "nvidia.com/x"}, "name"),  # required
    ("spec.template.spec.resourceClaims", [{"resourceClaimName": "c"}], "name"),
    ("metadata.labels", {"a": 1}, "not of type"),
])
def test_kubevirt_validator_rejects_what_kubevirt_rejects(path, value, words):
    schema = kubevirt_schema()
    vm = _set(_vm(), path, value)
    problems = kubevirt_problems(vm, schema)
    assert problems and any(words in p for p in problems), problems
    with pytest.raises(KubeVirtSchemaError):
        validate_kubevirt(vm, schema)


def test_kubevirt_validator_needs_spec_and_a_known_kind():
    schema = kubevirt_schema()
    vm = _vm()
    del vm["spec"]
    assert any("spec" in p for p in kubevirt_problems(vm, schema))
    assert kubevirt_problems({"apiVersion": "kubevirt.io/v1", "kind": "NoSuchThing"}, schema)
    assert kubevirt_problems({"apiVersion": "apps/v1", "kind": "Deployment"}, schema)
    validate_kubevirt(_vm(), schema)  # and a good one passes


def test_kubevirt_validator_accepts_quantities_nulls_and_free_form():
    vm = _vm()
    vm["spec"]["template"]["spec"]["domain"]["memory"]["guest"] = 4294967296  # int Quantity
    vm["metadata"]["creationTimestamp"] = None  # type [string, null]
    vm["spec"]["template"]["spec"]["domain"]["resources"] = {"requests": {"memory": "4Gi", "cpu": 1}}
    assert kubevirt_problems(vm, kubevirt_schema()) == []


def test_kubernetes_schema_rejects_bad_dra_objects():
    tmpl = render("claim-template", {"profile": "A100-4C"})[0]
    tmpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["bogus"] = 1
    assert kubernetes_problems(tmpl)
    cls = render("deviceclasses")[0]
    cls["spec"]["selectors"][0]["cel"] = {}
    assert kubernetes_problems(cls)


def test_the_schema_is_given_never_guessed(monkeypatch):
    """Installed code has no schema of its own: no argument and no $VGPUCTL_KUBEVIRT_OPENAPI is an error."""
    monkeypatch.delenv(ENV_SCHEMA, raising=False)
    with pytest.raises(KubeVirtSchemaMissing, match=ENV_SCHEMA):
        kubevirt_problems(_vm())
    monkeypatch.setenv(ENV_SCHEMA, "/nonexistent/kubevirt-openapi.json")
    with pytest.raises(FileNotFoundError, match="/nonexistent"):
        kubevirt_problems(_vm())


def test_the_schema_comes_from_the_environment(monkeypatch):
    kubevirt_schema()  # skips without one
    monkeypatch.setenv(ENV_SCHEMA, str(kubevirt_schema_path()))
    assert kubevirt_problems(_vm()) == []
    assert kubevirt_problems(_set(_vm(), "spec.runStrategy", 3))


def as_openapi_v3(swagger: dict) -> dict:
    """KubeVirt's swagger as an API server publishes a group-version (``/openapi/v3/apis/...``):
    ``components.schemas`` under reversed names, kinds found by ``x-kubernetes-group-version-kind``,
    references wrapped in ``allOf`` as kube-openapi writes them."""
    def name(n: str) -> str:
        return "io.kubevirt.api." + n

    def conv(node, in_properties=False):
        if isinstance(node, list):
            return [conv(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            if k == "$ref":
                out[k] = "#/components/schemas/" + name(v.removeprefix("#/definitions/"))
            elif k == "properties":
                out[k] = {p: conv(sub, in_properties=True) for p, sub in v.items()}
            else:
                out[k] = conv(v)
        if in_properties and "$ref" in out:
            return {"allOf": [{"$ref": out.pop("$ref")}], **out, "default": {}}
        return out

    schemas = {name(n): conv(d) for n, d in swagger["definitions"].items()}
    for kind in ("VirtualMachine", "KubeVirt"):
        schemas[name(f"v1.{kind}")]["x-kubernetes-group-version-kind"] = [
            {"group": "kubevirt.io", "version": "v1", "kind": kind}]
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.35.0"},
            "components": {"schemas": schemas}}


@pytest.fixture(scope="module")
def kubevirt_v3() -> dict:
    kubevirt_schema()  # skips without one
    return as_openapi_v3(json.loads(kubevirt_schema_path().read_text()))


def test_an_openapi_v3_document_validates_the_same(kubevirt_v3):
    """A cluster's document (OpenAPI v3, kinds by group-version-kind, allOf references) rejects
    what the swagger file rejects."""
    schema = KubeVirtSchema(kubevirt_v3, source="test v3")
    assert schema.definition_for(_vm()) == "io.kubevirt.api.v1.VirtualMachine"
    assert kubevirt_problems(_vm(), schema) == []
    assert kubevirt_problems(render("kubevirt-cr", {"inventories": [inventory_dict()]})[0], schema) == []
    bad = _set(_vm(), "spec.template.spec.domain.devices.gpus.0.bogus", 1)
    assert any("bogus" in p for p in kubevirt_problems(bad, schema))
    meta = _set(_vm(), "metadata.labels", {"a": 1})  # behind an allOf reference
    assert any("not of type" in p for p in kubevirt_problems(meta, schema))
    with pytest.raises(ValueError, match="neither"):
        KubeVirtSchema({"openapi": "3.0.0"})


# --------------------------------------------------------------------------- inputs fail clearly


@pytest.mark.parametrize("kind, values, fragment", [
    ("vm", {"gpus": {"T4-1Q": 1}}, "name: required"),
    ("vm", {"name": "My_VM", "gpus": {"T4-1Q": 1}}, "name: 'My_VM' is not a DNS label"),
    ("vm", {"name": "v"}, "at least one vGPU or a passthrough GPU"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 0}}, "gpus.T4-1Q: count 0"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": True}}, "gpus.T4-1Q"),
    ("vm", {"name": "v", "gpus": {"T4/1Q": 1}}, "is not a vGPU profile"),
    ("vm", {"name": "v", "gpus": {"Z9-1Q": 1}}, "full type name"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "mode": "magic"}, "mode"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "memory": "lots"}, "memory: 'lots' is not a Kubernetes quantity"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "display": False, "ramfb": True}, "ramfb"),
    ("vm", {"name": "v", "passthrough": "TU104GL [Tesla T4]", "display": True}, "apply to vGPUs"),
    ("vm", {"name": "v", "mode": "dra", "passthrough": "nvidia.com/TU104GL_TESLA_T4"}, "product name"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "colour": "red"}, "colour: unknown key (the keys: vgpuctl render vm -h)"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "cpu": 4}, "cpu: unknown key; did you mean 'cpus'?"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "mode": "dras"}, "(allowed: classic, dra); did you mean 'dra'?"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "cpus": "many"}, "cpus: 'many' is not a whole number"),
    ("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "image": "has space"}, "image"),
    ("claim-template", {}, "exactly one of profile, min_memory, first_available"),
    ("claim-template", {"profile": "A100-4C", "min_memory": "8Gi"}, "got profile, min_memory"),
    ("claim-template", {"min_memory": "0"}, "greater than zero"),
    ("claim-template", {"min_memory": "8 GB"}, "not a Kubernetes quantity"),
    ("claim-template", {"first_available": []}, "first_available"),
    ("claim-template", {"first_available": ["A"] * 2}, "repeat"),
    ("claim-template", {"first_available": [f"T4-{i}Q" for i in range(9)]}, "at most"),
    ("claim-template", {"profile": "T4-1Q", "product": "x"}, "product"),
    ("claim-template", {"profile": 'T4"1Q'}, "is not a vGPU profile"),
    ("claim-template", {"profile": "T4-1Q", "driver": "Not_A_Domain"}, "driver"),
    ("kubevirt-cr", {}, "inventories"),
    ("kubevirt-cr", {"classic": False}, "classic or dra"),
    ("kubevirt-cr", {"inventories": "INV", "types": ["Nope-9Q"]}, "offered by no GPU"),
    ("kubevirt-cr", {"inventories": "INV", "extra_feature_gates": ["bad gate"]}, "extra_feature_gates"),
    ("passthrough-pod", {"name": "Pod"}, "name"),
    ("nonsense", {}, "kind: 'nonsense' is not a template"),
])
def test_wrong_values_fail_with_a_message_naming_the_field(kind, values, fragment):
    if values.get("inventories") == "INV":
        values = {**values, "inventories": [inventory_dict()]}
    with pytest.raises(RenderError) as exc:
        render(kind, values)
    assert any(fragment in p for p in exc.value.problems), exc.value.problems
    assert not any("Input should be" in p or "Value error" in p for p in exc.value.problems), exc.value.problems


def test_render_accepts_models_and_aliases():
    assert render("claimtemplate", ClaimTemplateInput(profile="A100-4C")) == render("claim-template", {"profile": "A100-4C"})
    assert render("VirtualMachine", VmInput(name="a", gpus={"T4-1Q": 1}))[-1]["kind"] == "VirtualMachine"
    assert render("kubevirt", KubeVirtCrInput(classic=False, dra=True))[0]["kind"] == "KubeVirt"


# --------------------------------------------------------------------------- VirtualMachine


def _devices(vm: dict) -> dict:
    return vm["spec"]["template"]["spec"]["domain"]["devices"]


def test_classic_vm_requests_device_plugin_resources_with_display_options():
    vm = render("vm", {"name": "v", "gpus": {"T4-1Q": 2, "NVIDIA A100-4C": 1}, "display": True, "ramfb": False,
                       "passthrough": "TU104GL [Tesla T4]"})[0]
    devs = _devices(vm)
    assert [g["deviceName"] for g in devs["gpus"]] == ["nvidia.com/GRID_T4-1Q"] * 2 + ["nvidia.com/NVIDIA_A100-4C"]
    assert len({g["name"] for g in devs["gpus"]}) == 3
    for g in devs["gpus"]:
        assert g["virtualGPUOptions"] == {"display": {"enabled": True, "ramFB": {"enabled": False}}}
        assert "claimName" not in g
    assert devs["hostDevices"] == [{"name": "hostgpu1", "deviceName": "nvidia.com/TU104GL_TESLA_T4"}]
    assert "resourceClaims" not in vm["spec"]["template"]["spec"]


def test_display_options_are_omitted_unless_given():
    vm = render("vm", {"name": "v", "gpus": {"T4-1Q": 1}})[0]
    assert "virtualGPUOptions" not in _devices(vm)["gpus"][0]
    vm = render("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "display": False})[0]
    assert _devices(vm)["gpus"][0]["virtualGPUOptions"] == {"display": {"enabled": False}}


def test_vm_boots_a_container_disk_with_cloud_init():
    vm = render("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "ssh_authorized_keys": ["ssh-ed25519 AAAA me"],
                       "password": "pw"})[0]
    spec = vm["spec"]["template"]["spec"]
    disks = {d["name"] for d in spec["domain"]["devices"]["disks"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert disks == set(vols) == {"rootdisk", "cloudinitdisk"}
    assert vols["rootdisk"]["containerDisk"]["image"] == "quay.io/containerdisks/fedora:latest"
    user_data = vols["cloudinitdisk"]["cloudInitNoCloud"]["userData"]
    assert user_data.startswith("#cloud-config\n")
    doc = yaml.safe_load(user_data)
    assert doc["ssh_authorized_keys"] == ["ssh-ed25519 AAAA me"] and doc["password"] == "pw"
    assert vm["spec"]["runStrategy"] == "Always"
    assert spec["networks"] == [{"name": "default", "pod": {}}]
    custom = render("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "user_data": "#cloud-config\nhostname: x\n",
                           "image": "quay.io/containerdisks/ubuntu:24.04"})[0]
    vols = {v["name"]: v for v in custom["spec"]["template"]["spec"]["volumes"]}
    assert vols["cloudinitdisk"]["cloudInitNoCloud"]["userData"] == "#cloud-config\nhostname: x"
    assert vols["rootdisk"]["containerDisk"]["image"] == "quay.io/containerdisks/ubuntu:24.04"


def test_hostile_strings_stay_data():
    """Values are quoted, never spliced into YAML or CEL structure."""
    ud = 'x: "y"\n---\nkind: Secret\n'
    objs = render("vm", {"name": "v", "gpus": {"T4-1Q": 1}, "user_data": ud})
    assert len(objs) == 1
    vol = objs[0]["spec"]["template"]["spec"]["volumes"][1]
    assert vol["cloudInitNoCloud"]["userData"] == ud.strip()


def test_dra_vm_uses_claims_one_device_per_request():
    objs = render("vm", {"name": "v", "mode": "dra", "gpus": {"A100-4C": 2, "NVIDIA L40S-8Q": 1},
                         "passthrough": "TU104GL [Tesla T4]", "display": True})
    templates = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ResourceClaimTemplate"}
    (vm,) = [o for o in objs if o["kind"] == "VirtualMachine"]
    assert objs[-1] is vm  # templates first: they must exist when the VM starts
    spec = vm["spec"]["template"]["spec"]
    claims = {c["name"]: c for c in spec["resourceClaims"]}
    devs = _devices(vm)
    assert len(devs["gpus"]) == 3 and len(devs["hostDevices"]) == 1
    for entry in devs["gpus"] + devs["hostDevices"]:
        assert "deviceName" not in entry
        claim = claims[entry["claimName"]]
        tmpl = templates[claim["resourceClaimTemplateName"]]
        requests = tmpl["spec"]["spec"]["devices"]["requests"]
        assert entry["requestName"] in {r["name"] for r in requests}
        for r in requests:
            assert r["exactly"]["count"] == 1  # KubeVirt reads exactly one device per request
    # every device has its own claim, and shared templates are rendered once
    assert len(claims) == 4
    assert sorted(templates) == ["gpu-passthrough-tu104gl-tesla-t4", "vgpu-a100-4c", "vgpu-l40s-8q"]
    assert devs["gpus"][0]["virtualGPUOptions"] == {"display": {"enabled": True}}
    assert "virtualGPUOptions" not in devs["hostDevices"][0]


def test_dra_vm_claims_select_the_intended_devices():
    objs = render("vm", {"name": "v", "mode": "dra", "gpus": {"A100-4C": 1, "L40S-8Q": 1},
                         "passthrough": "TU104GL [Tesla T4]"})
    classes = classes_by_name(render("deviceclasses"))
    slices = catalog_slices() + [foreign_slice()]
    pool = catalog_pool()
    by_profile = {}
    for d in pool.devices:
        by_profile.setdefault(d.attributes["profile"]["string"], set()).add(d.name)
    for o in objs:
        if o["kind"] != "ResourceClaimTemplate":
            continue
        (got,) = claim_selection(o, classes, slices).values()
        name = o["metadata"]["name"]
        if name == "vgpu-a100-4c":
            assert got == by_profile["A100-4C"] and len(got) == 10
        elif name == "vgpu-l40s-8q":
            assert got == by_profile["L40S-8Q"] and len(got) == 6
        else:
            assert got == {"gpu-0-passthrough", "gpu-1-passthrough"}


# --------------------------------------------------------------------------- KubeVirt CR


def test_kubevirt_cr_permits_the_inventory_as_external_resources():
    inv = catalog_inventory()
    (kv,) = render("kubevirt-cr", {"inventories": [inv.model_dump(mode="json")]})
    cfg = kv["spec"]["configuration"]
    assert cfg["mediatedDevicesConfiguration"] == {"enabled": False}
    assert cfg["developerConfiguration"]["featureGates"] == ["GPU", "HostDevices"]
    phd = cfg["permittedHostDevices"]
    entries = phd["mediatedDevices"] + phd["pciHostDevices"]
    assert all(e["externalResourceProvider"] is True for e in entries)
    names = [e["resourceName"] for e in entries]
    assert len(names) == len(set(names))
    mdev = {e["mdevNameSelector"]: e["resourceName"] for e in phd["mediatedDevices"]}
    want = {t.name for g in inv.gpus for t in g.types if t.framework == "mdev" and not t.mig_backed}
    assert set(mdev) == want
    for name, resource in mdev.items():
        assert resource == "nvidia.com/" + name.replace(" ", "_")
    assert mdev["GRID T4-1Q"] == "nvidia.com/GRID_T4-1Q"
    assert "NVIDIA A100-1-5C" not in mdev  # MIG-backed: needs MIG
    pci = {(e["pciVendorSelector"], e["resourceName"]) for e in phd["pciHostDevices"]}
    assert ("10DE:1EB8", "nvidia.com/TU104GL_TESLA_T4") in pci
    assert ("10DE:20F1", "nvidia.com/GA100_A100_PCIE_40GB") in pci
    l40s = inv.gpus[3]
    vf = l40s.vfs[0]
    vendor_vfio = {r for s, r in pci if s == pci_vendor_selector(vf.vendor_id, vf.device_id)}
    assert {f"nvidia.com/{t.name.replace(' ', '_')}" for t in l40s.types} <= vendor_vfio
    assert_valid([kv])


def test_kubevirt_cr_options():
    inv = inventory_dict()
    (kv,) = render("kubevirt-cr", {"inventories": [inv, inv], "types": ["T4-1Q", "nvidia-468"], "passthrough": False,
                                   "dra": True, "extra_feature_gates": ["LiveMigration", "HostDevices"]})
    cfg = kv["spec"]["configuration"]
    assert cfg["developerConfiguration"]["featureGates"] == [
        "LiveMigration", "HostDevices", "GPU", "GPUsWithDRA", "HostDevicesWithDRA"]
    assert cfg["permittedHostDevices"] == {"mediatedDevices": [
        {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q", "externalResourceProvider": True},
        {"mdevNameSelector": "NVIDIA A100-4C", "resourceName": "nvidia.com/NVIDIA_A100-4C", "externalResourceProvider": True},
    ]}
    (kv,) = render("kubevirt-cr", {"classic": False, "dra": True})
    cfg = kv["spec"]["configuration"]
    assert "permittedHostDevices" not in cfg
    assert cfg["developerConfiguration"]["featureGates"] == ["HostDevices", "GPUsWithDRA", "HostDevicesWithDRA"]
    assert cfg["mediatedDevicesConfiguration"] == {"enabled": False}


def test_kubevirt_cr_turns_on_vgpu_live_migration_for_the_device_plugin_path_only():
    """KubeVirt 1.9: VGPULiveMigration (alpha) needs TargetSideMigrationHooks; DRA devices cannot migrate (VEP 10)."""
    (kv,) = render("kubevirt-cr", {"inventories": [inventory_dict()], "vgpu_live_migration": True})
    gates = kv["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    assert gates == ["GPU", "HostDevices", "VGPULiveMigration", "TargetSideMigrationHooks"]
    with pytest.raises(RenderError) as exc:
        render("kubevirt-cr", {"classic": False, "dra": True, "vgpu_live_migration": True})
    assert "vgpu_live_migration" in str(exc.value) and "cannot migrate yet" in str(exc.value)


def test_the_documented_live_migration_command_renders_a_patch_that_keeps_permitted_host_devices(capsys):
    """README: ``vgpuctl render kubevirt-cr --set vgpu_live_migration=true`` (issue #36; was exit 2 without
    --inventory): the gates and mdev management off, no permittedHostDevices (the merge patch keeps the CR's)."""
    from vgpuctl.main import main

    assert main(["render", "kubevirt-cr", "--set", "vgpu_live_migration=true"]) == 0
    out, err = capsys.readouterr()
    (kv,) = yaml.safe_load_all(out)
    cfg = kv["spec"]["configuration"]
    assert cfg["developerConfiguration"]["featureGates"] == ["GPU", "HostDevices", "VGPULiveMigration",
                                                             "TargetSideMigrationHooks"]
    assert cfg["mediatedDevicesConfiguration"] == {"enabled": False} and "permittedHostDevices" not in cfg
    assert "note: no inventories: permittedHostDevices left out" in err
    assert main(["render", "kubevirt-cr"]) == 2  # setting the classic path up still needs the inventories
    assert "inventories:" in capsys.readouterr().err


def test_resource_names_match_nvidias_device_plugin():
    assert resource_name_for_type("GRID T4-1Q") == "nvidia.com/GRID_T4-1Q"
    assert resource_name_for_type("NVIDIA A100-4C") == "nvidia.com/NVIDIA_A100-4C"
    assert resource_name_for_pci("TU104GL [Tesla T4]") == "nvidia.com/TU104GL_TESLA_T4"
    assert resource_name_for_pci("GA100 [A100 PCIe 40GB]") == "nvidia.com/GA100_A100_PCIE_40GB"
    assert pci_vendor_selector("0x10de", "0x1eb8") == "10DE:1EB8"
    assert resource_env_var("nvidia.com/GRID_T4-1Q", "mdev") == "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q"
    assert resource_env_var("nvidia.com/TU104GL_TESLA_T4", "pci") == "PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4"


# --------------------------------------------------------------------------- CEL: the Kubernetes library


@pytest.mark.parametrize("expr, want", [
    ('quantity("1Gi") == quantity("1024Mi")', True),
    ('quantity("1Gi").compareTo(quantity("1G")) == 1', True),
    ('quantity("500m").compareTo(quantity("0.5")) == 0', True),
    ('quantity("8Gi").isGreaterThan(quantity("7Gi"))', True),
    ('quantity("8Gi").isLessThan(quantity("7Gi"))', False),
    ('quantity("1Ki").asInteger() == 1024', True),
    ('quantity("1.5").asApproximateFloat() == 1.5', True),
    ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")', True),
    ('quantity("1Gi").add(1).asInteger() == 1073741825', True),
    ('quantity("2Gi").sub(quantity("1Gi")) == quantity("1Gi")', True),
    ('quantity("2").sub(3).sign() == -1', True),
    ('quantity("1m").isInteger()', False),
    ('isQuantity("10Gi") && !isQuantity("10 Gi")', True),
    ('semver("1.10.0").isGreaterThan(semver("1.9.9"))', True),
    ('semver("1.0.0-rc.1").compareTo(semver("1.0.0")) == -1', True),
])
def test_quantity_library(expr, want):
    assert kcel.compile_selector(expr).evaluate({"driver": "x", "attributes": {}, "capacity": {}}) is want


@pytest.mark.parametrize("expr", [
    'quantity("ten") == quantity("1")',           # bad quantity
    'quantity("1m").asInteger() == 0',              # not an integer
    'quantity("1").compareTo(1) == 0',              # compareTo wants a Quantity
    'device.attributes["vgpu.kubevirt.io"].nope == "x"',  # missing attribute
    '"not a bool"',
])
def test_runtime_errors_abort_like_the_scheduler(expr):
    dev = kcel.device_variable({"name": "d", "attributes": {"type": {"string": "vgpu"}}}, DRIVER)
    with pytest.raises(kcel.CelError):
        kcel.compile_selector(expr).evaluate(dev)


@pytest.mark.parametrize("expr", ["device.driver ==", "", "x.y == 1", "a" * 10241])
def test_bad_selectors_do_not_compile(expr):
    with pytest.raises(kcel.CelError):
        kcel.compile_selector(expr)


def test_device_variable_groups_by_domain():
    dev = {"name": "d", "attributes": {"profile": {"string": "A100-4C"}, "gpuIndex": {"int": 2},
                                       "resource.kubernetes.io/pciBusID": {"string": "0000:16:00.4"},
                                       "driverVersion": {"version": "550.54.15"}},
           "capacity": {"memory": {"value": "4Gi"}}}
    var = kcel.device_variable(dev, DRIVER)
    assert var["attributes"][DRIVER]["profile"] == "A100-4C"
    assert var["attributes"][DRIVER]["gpuIndex"] == 2
    assert var["attributes"]["resource.kubernetes.io"]["pciBusID"] == "0000:16:00.4"
    ok = [
        'device.capacity["vgpu.kubevirt.io"].memory == quantity("4096Mi")',
        'device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:16:")',
        'device.attributes["vgpu.kubevirt.io"].driverVersion.isGreaterThan(semver("535.0.0"))',
        '!has(device.attributes["other.example.com"].x)',  # unknown domain: an empty map
        'device.allowMultipleAllocations == false',
    ]
    for e in ok:
        assert kcel.compile_selector(e).evaluate(var) is True, e


# --------------------------------------------------------------------------- CEL: selection on a catalog node


@pytest.fixture(scope="module")
def classes():
    return classes_by_name(render("deviceclasses"))


def _vgpus(pool, pred=lambda d: True) -> set[str]:
    return {d.name for d in pool.devices if d.kind == "vgpu" and pred(d)}


@pytest.mark.parametrize("version", [(1, 34), (1, 35), (1, 37)])
def test_device_classes_select_exactly_their_kind(classes, version):
    pool = catalog_pool(server_version=version)
    slices = catalog_slices(server_version=version) + [foreign_slice()]
    vgpu = selected_names(slices, kcel.class_selectors(classes["vgpu.kubevirt.io"]))
    passthrough = selected_names(slices, kcel.class_selectors(classes["passthrough.vgpu.kubevirt.io"]))
    assert vgpu == _vgpus(pool) and len(vgpu) > 0
    assert passthrough == {f"gpu-{i}-passthrough" for i in range(4)}
    assert not vgpu & passthrough
    published = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
    assert published - vgpu - passthrough == {"gpu-0", "gpu-vfio-1"}  # only the foreign driver's left


@pytest.mark.parametrize("version", [(1, 34), (1, 37)])
def test_profile_claim_selects_exactly_that_profile(classes, version):
    pool = catalog_pool(server_version=version)
    slices = catalog_slices(server_version=version) + [foreign_slice()]
    for profile, n in [("A100-4C", 10), ("T4-1Q", 32), ("L40S-1B", 32)]:
        (tmpl,) = render("claim-template", {"profile": profile})
        got = claim_selection(tmpl, classes, slices)
        # the slots of the profile's size: they may become it (its VgpuConfig in the claim says so)
        assert got == {"vgpu": _vgpus(pool, lambda d, profile=profile: profile in d.type_choices)}
        assert len(got["vgpu"]) == n
        assert tmpl["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["vgpuType"] == profile
    if version >= (1, 37):  # older servers publish one framebuffer size per GPU
        (tmpl,) = render("claim-template", {"profile": "NVIDIA A100-40C"})
        assert claim_selection(tmpl, classes, slices) == {"vgpu": {"gpu-2-vgpu-40gb-0"}}


@pytest.mark.parametrize("minimum", ["8Gi", "8192Mi", "10Gi", "1", "48Gi", "49Gi"])
def test_memory_claim_selects_exactly_the_vgpus_with_enough_memory(classes, minimum):
    pool = catalog_pool()
    (tmpl,) = render("claim-template", {"min_memory": minimum})
    got = claim_selection(tmpl, classes, catalog_slices() + [foreign_slice()])["vgpu"]
    want = _vgpus(pool, lambda d: parse_quantity(d.capacity["memory"]) >= parse_quantity(minimum))
    assert got == want
    if minimum == "8Gi":
        t4 = 2 * (2 + 1)                                      # two T4: the 8 GB slots x2 (8A/8C/8Q), 16 GB x1
        a100 = 5 + 4 + 2 + 1                                  # 8C, 10C, 20C, 40C
        l40s = 6 + 4 + 3 + 2 + 1                              # the 8 .. 48 GB slots (A and Q each)
        assert len(got) == t4 + a100 + l40s == 34
        assert all(parse_quantity(d.capacity["memory"]) >= 8 * GiB for d in pool.devices if d.name in got)
    if minimum == "49Gi":
        assert got == set()


def test_first_available_claim_orders_profiles(classes):
    pool = catalog_pool()
    (tmpl,) = render("claim-template", {"first_available": ["A100-8C", "L40S-8Q", "NVIDIA T4-8Q"]})
    req = tmpl["spec"]["spec"]["devices"]["requests"][0]
    assert [s["name"] for s in req["firstAvailable"]] == ["a100-8c", "l40s-8q", "t4-8q"]
    got = claim_selection(tmpl, classes, catalog_slices() + [foreign_slice()])
    assert list(got) == ["vgpu/a100-8c", "vgpu/l40s-8q", "vgpu/t4-8q"]
    for key, profile, n in [("vgpu/a100-8c", "A100-8C", 5), ("vgpu/l40s-8q", "L40S-8Q", 6), ("vgpu/t4-8q", "T4-8Q", 4)]:
        assert got[key] == _vgpus(pool, lambda d, profile=profile: d.attributes["profile"]["string"] == profile)
        assert len(got[key]) == n


def test_passthrough_claims_select_whole_gpus(classes):
    slices = catalog_slices() + [foreign_slice()]
    (tmpl,) = render("claim-template", {"passthrough": True})
    assert claim_selection(tmpl, classes, slices) == {"gpu": {f"gpu-{i}-passthrough" for i in range(4)}}
    (tmpl,) = render("claim-template", {"passthrough": True, "product": "AD102GL [L40S]"})
    assert claim_selection(tmpl, classes, slices) == {"gpu": {"gpu-3-passthrough"}}
    pod_objs = render("passthrough-pod", {"product": "TU104GL [Tesla T4]"})
    tmpl, pod = pod_objs
    assert claim_selection(tmpl, classes, slices) == {"gpu": {"gpu-0-passthrough", "gpu-1-passthrough"}}
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": tmpl["metadata"]["name"]}]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]


def test_unknown_profile_selects_nothing_without_error(classes):
    (tmpl,) = render("claim-template", {"profile": "H100-80C"})
    assert claim_selection(tmpl, classes, catalog_slices()) == {"vgpu": set()}


def test_other_driver_names_work(classes):
    objs = render("deviceclasses", {"driver": "gpu.example.com", "vgpu_class": "vgpu.example.com",
                                    "passthrough_class": "pt.example.com"})
    assert [o["metadata"]["name"] for o in objs] == ["vgpu.example.com", "pt.example.com"]
    got = selected_names(catalog_slices(), kcel.class_selectors(objs[0]))
    assert got == set()  # the slices are published by vgpu.kubevirt.io


# --------------------------------------------------------------------------- CLI


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    from vgpuctl.main import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_renders_values_file_and_sets(tmp_path, capsys):
    f = tmp_path / "values.yaml"
    f.write_text("name: demo\nmode: dra\ngpus:\n  A100-4C: 1\n")
    rc, out, err = _run(["render", "vm", "-f", str(f), "--set", "gpus.L40S-8Q=2", "--set", "display=false"], capsys)
    assert rc == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["ResourceClaimTemplate", "ResourceClaimTemplate", "VirtualMachine"]
    assert len(docs[-1]["spec"]["template"]["spec"]["resourceClaims"]) == 3
    assert_valid(docs)


def test_cli_reports_bad_values(capsys):
    rc, out, err = _run(["render", "claim-template", "--set", "min_memory=lots"], capsys)
    assert rc == 2 and out == ""
    assert "min_memory: 'lots' is not a Kubernetes quantity" in err
    rc, out, err = _run(["render", "vm", "--set", "name"], capsys)
    assert rc == 2 and "expected key=value" in err


@pytest.mark.parametrize("argv", [
    ["--simulate", "render", "kubevirt-cr"],
    ["render", "kubevirt-cr", "--simulate"],
    ["render", "kubevirt-cr", "--simulate", "default", "--set", "dra=true"],
])
def test_cli_kubevirt_cr_from_the_simulated_host(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path))
    rc, out, err = _run(argv, capsys)
    assert rc == 0, err
    (kv,) = list(yaml.safe_load_all(out))
    phd = kv["spec"]["configuration"]["permittedHostDevices"]
    assert {"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/GRID_T4-1Q",
            "externalResourceProvider": True} in phd["mediatedDevices"]
    assert_valid([kv])


def test_cli_kubevirt_cr_from_inventory_files(tmp_path, capsys):
    inv = tmp_path / "node1.json"
    inv.write_text(json.dumps(inventory_dict()))
    rc, out, err = _run(["render", "kubevirt-cr", "--inventory", str(inv), "--set", "vgpus=false"], capsys)
    assert rc == 0, err
    (kv,) = list(yaml.safe_load_all(out))
    assert "mediatedDevices" not in kv["spec"]["configuration"]["permittedHostDevices"]
    rc, out, err = _run(["render", "passthrough-pod", "--inventory", str(inv)], capsys)
    assert rc == 2 and "passthrough-pod names no vGPU type" in err
    rc, out, err = _run(["render", "deviceclasses", "--inventory", str(inv), "--set", "profiles=[A16-2Q]"], capsys)
    assert rc == 2 and "profiles.A16-2Q: 'A16-2Q' is not a vGPU type of the given nodes" in err  # checked too


RENDER_VM = ["render", "vm", "--set", "name=v", "--set", "gpus.T4-1Q=1"]


def test_cli_says_when_it_did_not_validate(monkeypatch, capsys):
    monkeypatch.delenv(ENV_SCHEMA, raising=False)
    rc, out, err = _run(RENDER_VM, capsys)
    assert rc == 0 and "kind: VirtualMachine" in out
    assert "NOT validated against KubeVirt's schema" in err and "--kubeconfig" in err
    rc, out, err = _run(["render", "deviceclasses"], capsys)  # no KubeVirt object, nothing to validate
    assert rc == 0 and err == ""


def _requiring(schema: dict, definition: str, field: str) -> dict:
    """``schema`` with ``field`` required in ``definition``: a KubeVirt release our templates do not fit."""
    doc = copy.deepcopy(schema)
    defs = doc["definitions"] if "definitions" in doc else doc["components"]["schemas"]
    defs[definition].setdefault("required", []).append(field)
    return doc


def test_cli_validates_against_a_schema_file(tmp_path, monkeypatch, capsys):
    kubevirt_schema()  # skips without one
    path = kubevirt_schema_path()
    monkeypatch.delenv(ENV_SCHEMA, raising=False)
    rc, out, err = _run(RENDER_VM + ["--schema", str(path)], capsys)
    assert rc == 0 and err == "" and "kind: VirtualMachine" in out
    monkeypatch.setenv(ENV_SCHEMA, str(path))
    rc, out, err = _run(RENDER_VM, capsys)
    assert rc == 0 and err == ""
    future = tmp_path / "future.json"
    future.write_text(json.dumps(_requiring(json.loads(path.read_text()), "v1.VirtualMachineSpec", "futureField")))
    rc, out, err = _run(RENDER_VM + ["--schema", str(future)], capsys)
    assert rc == 1 and out == ""  # nothing to pipe into kubectl apply
    assert f"VirtualMachine v does not validate against {future}" in err and "futureField" in err
    rc, out, err = _run(RENDER_VM + ["--schema", str(tmp_path / "missing.json")], capsys)
    assert rc == 2 and out == "" and "missing.json" in err


class OpenApiStub:
    """Just enough of an API server to publish OpenAPI v3 documents (``docs``: path -> document)."""

    def __init__(self, docs: dict[str, dict]) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        stub = self
        self.docs, self.requests = docs, []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.requests.append(self.path)
                doc = stub.docs.get(self.path)
                code = 200 if doc is not None else 404
                body = json.dumps(doc if doc is not None else
                                  {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> OpenApiStub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: Path) -> Path:
        url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stub",
            "clusters": [{"name": "stub", "cluster": {"server": url}}],
            "users": [{"name": "stub", "user": {}}],
            "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}]}))
        return path


def test_cli_validates_against_the_clusters_schema(kubevirt_v3, tmp_path, monkeypatch, capsys):
    """--kubeconfig: the schema is the one the cluster serves for kubevirt.io/v1 (OpenAPI v3)."""
    from dra_bridge.apiclient.openapi import KUBEVIRT_V1

    monkeypatch.delenv(ENV_SCHEMA, raising=False)
    with OpenApiStub({KUBEVIRT_V1: kubevirt_v3}) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        rc, out, err = _run(RENDER_VM + ["--kubeconfig", kubeconfig], capsys)
        assert rc == 0 and err == "" and "kind: VirtualMachine" in out
        assert api.requests == [KUBEVIRT_V1]
        api.docs[KUBEVIRT_V1] = _requiring(kubevirt_v3, "io.kubevirt.api.v1.VirtualMachineSpec", "futureField")
        rc, out, err = _run(RENDER_VM + ["--kubeconfig", kubeconfig], capsys)
        assert rc == 1 and out == ""
        assert f"does not validate against the cluster's {KUBEVIRT_V1}" in err and "futureField" in err


def test_cli_refuses_a_cluster_without_kubevirt(tmp_path, monkeypatch, capsys):
    """The local API server serves no KubeVirt: --kubeconfig says so and prints nothing."""
    from dra_bridge.sim.apiserver import LocalApiServer

    monkeypatch.delenv(ENV_SCHEMA, raising=False)
    with LocalApiServer("1.35") as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        rc, out, err = _run(RENDER_VM + ["--kubeconfig", kubeconfig], capsys)
    assert rc == 2 and out == ""
    assert "cannot read KubeVirt's schema from the cluster" in err and "404" in err
    assert "is KubeVirt installed" in err


def test_parse_set_and_merge(tmp_path):
    assert parse_set(["a.b=1", "a.c=[x, y]", "d=true", "e="]) == {"a": {"b": 1, "c": ["x", "y"]}, "d": True, "e": ""}
    f = tmp_path / "v.yaml"
    f.write_text("gpus: {T4-1Q: 1}\nname: a\n")
    assert load_values([str(f)], ["gpus.T4-2Q=2", "name=b"]) == {"gpus": {"T4-1Q": 1, "T4-2Q": 2}, "name": "b"}
    with pytest.raises(RenderError):
        parse_set(["a=1", "a.b=2"])


def test_render_yaml_round_trips():
    objs = render("vm", {"name": "v", "mode": "dra", "gpus": {"A100-4C": 1}})
    text = render_yaml(objs)
    assert list(yaml.safe_load_all(text)) == objs
    assert "userData: |" in text


def test_templates_ship_with_the_package():
    import kubevirt_templates

    tdir = Path(kubevirt_templates.__file__).parent / "templates"
    assert (tdir / "__init__.py").exists()  # a package, so setuptools ships the *.j2 files
    assert sorted(p.name for p in tdir.glob("*.j2")) == [
        "deviceclasses.yaml.j2", "kubevirt.yaml.j2", "pod-passthrough.yaml.j2",
        "resourceclaimtemplate.yaml.j2", "virtualmachine.yaml.j2"]


def test_kubevirt_cr_permits_everything_the_device_plugin_advertises(tmp_path):
    """Same names on both sides: a node laid out with vGPUs of every framework and a
    passthrough GPU, advertised by the device plugin, all permitted by the rendered CR."""
    from dra_bridge.deviceplugin.resources import compute_resources
    from mdev_manager.config import load_config
    from mdev_manager.discovery import discover
    from mdev_manager.reconcile import reconcile
    from mdev_manager.sim.node import sim_node

    node = sim_node(tmp_path, "default")
    env, io = node.env, node.io
    assert reconcile(env, io, load_config(Path(__file__).parents[2] / "examples" / "layout.yaml")).ok
    inv = discover(env, io, node="sim-node-1")
    resources, warnings = compute_resources(inv)
    assert not warnings
    kinds = {spec.kind for spec in resources.values()}
    assert kinds == {"mdev", "pci"}
    (kv,) = render("kubevirt-cr", {"inventories": [inv.model_dump(mode="json")]})
    phd = kv["spec"]["configuration"]["permittedHostDevices"]
    mdev = {e["resourceName"]: e for e in phd["mediatedDevices"]}
    pci = {}
    for e in phd["pciHostDevices"]:
        pci.setdefault(e["resourceName"], set()).add(e["pciVendorSelector"])
    functions = {g.address: g for g in inv.gpus} | {vf.address: vf for g in inv.gpus for vf in g.vfs}
    for name, spec in resources.items():
        if spec.kind == "mdev":
            assert name in mdev, name
            assert {d.type_name for d in spec.devices} == {mdev[name]["mdevNameSelector"]}
        else:
            assert name in pci, name
            for d in spec.devices:
                f = functions[d.id]
                assert pci_vendor_selector(f.vendor_id, f.device_id) in pci[name]


def test_the_migration_drain_creates_is_valid_for_kubevirt():
    """``vgpuctl drain --migrate`` creates a VirtualMachineInstanceMigration: KubeVirt's schema accepts it
    (generateName stands in for a name the server gives)."""
    from dra_bridge.apiclient.maintenance import migration_object

    obj = migration_object("vms", "a-vm-with-a-rather-long-name-that-goes-on-and-on")
    assert obj["metadata"]["generateName"].endswith("-drain-") and len(obj["metadata"]["generateName"]) <= 63 - 5
    schema = kubevirt_schema()
    assert schema.definition_for(obj).endswith("VirtualMachineInstanceMigration")
    assert schema.problems(obj) == []
