"""Classic resource names through DRA (KEP-5004): DeviceClasses mapping ``nvidia.com/GRID_T4-8Q``
and friends, prepare setting the variable KubeVirt's virt-launcher reads (``MDEV_PCI_RESOURCE_<R>`` /
``PCI_RESOURCE_<R>``) in the CDI spec, and an unchanged ``deviceName`` VM sharing a GPU's counters
with a DRA VM on the simulated cluster (1.36 defaults), Pending where the server drops the mapping."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import jsonschema
import pytest

from dra_bridge.kubeletplugin.claimconfig import VgpuConfigError, requested_resource
from dra_bridge.sim.cluster import SimCluster
from dra_bridge.sim.demo import WORKLOADS, render_workload
from dra_bridge.sim.workloads import EXTENDED_RESOURCE_CLAIM
from kubevirt_templates.render import RenderError, render
from tests.support.dra import (
    DictClaims,
    cdi_device,
    cdi_problems,
    claim_object,
    devices_of,
    make_driver,
    make_node,
    schema_validate,
)

DRIVER = "vgpu.kubevirt.io"
CDI_SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "reference" / "upstream" / "cdi-schema"

CLASSIC_VM = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm-classic"},
              "spec": {"runStrategy": "Always", "template": {"spec": {
                  "domain": {"devices": {"gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GRID_T4-8Q"}]},
                             "resources": {"requests": {"memory": "1Gi"}}}}}}}


def upstream_cdi_validate(spec: dict) -> None:
    """The CDI spec against the upstream JSON schema (../shared/reference/upstream/cdi-schema), where
    it is beside the repository (:func:`test_the_upstream_cdi_schema_is_at_hand` says when not)."""
    if not (CDI_SCHEMA / "schema.json").exists():
        return
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    schema = json.loads((CDI_SCHEMA / "schema.json").read_text())
    defs = Resource.from_contents(json.loads((CDI_SCHEMA / "defs.json").read_text()), default_specification=DRAFT7)
    jsonschema.Draft7Validator(schema, registry=Registry().with_resource("defs.json", defs)).validate(spec)


def test_the_upstream_cdi_schema_is_at_hand():
    if not (CDI_SCHEMA / "schema.json").exists():
        pytest.skip(f"the upstream CDI schema is not beside the repository ({CDI_SCHEMA}): CDI specs are checked "
                    "by the strict parser rules only")
    with pytest.raises(jsonschema.ValidationError):
        upstream_cdi_validate({"cdiVersion": "0.5.0", "kind": "x/y", "devices": [{"name": 1}]})


def class_config(resource: str, vgpu_type: str | None = None) -> dict:
    params = {"apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", "resourceName": resource}
    if vgpu_type:
        params["vgpuType"] = vgpu_type
    return {"source": "FromClass", "requests": [], "opaque": {"driver": DRIVER, "parameters": params}}


# --------------------------------------------------------------------------- render


@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_render_maps_each_class_to_its_classic_resource(version):
    objs = render("deviceclasses", {"profiles": ["T4-2Q", "A100-4C"], "products": ["TU104GL [Tesla T4]"],
                                    "extended_resources": True})
    for o in objs:
        schema_validate(o, version)
    by_name = {o["metadata"]["name"]: o["spec"] for o in objs}
    assert by_name["vgpu-t4-2q"]["extendedResourceName"] == "nvidia.com/GRID_T4-2Q"  # the device plugin's name
    assert by_name["vgpu-a100-4c"]["extendedResourceName"] == "nvidia.com/NVIDIA_A100-4C"
    assert by_name["gpu-passthrough-tu104gl-tesla-t4"]["extendedResourceName"] == "nvidia.com/TU104GL_TESLA_T4"
    assert by_name["passthrough.vgpu.kubevirt.io"]["extendedResourceName"] == "nvidia.com/vfio-device"
    assert "extendedResourceName" not in by_name["vgpu.kubevirt.io"]
    params = by_name["vgpu-t4-2q"]["config"][0]["opaque"]["parameters"]
    assert params == {"apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", "vgpuType": "T4-2Q",
                      "resourceName": "nvidia.com/GRID_T4-2Q"}
    # without the flag: as before, no mapping
    plain = render("deviceclasses", {"profiles": ["T4-2Q"]})
    assert not any("extendedResourceName" in o["spec"] for o in plain)


def test_render_refuses_a_resource_name_kubernetes_would():
    with pytest.raises(RenderError, match="vfio_resource|extended resource name"):
        render("deviceclasses", {"extended_resources": True, "vfio_resource": "bad name!"})


# --------------------------------------------------------------------------- prepare


def test_config_resource_name_is_checked():
    claim = {"status": {"allocation": {"devices": {"config": [class_config("nvidia.com/GRID_T4-2Q", "T4-2Q")]}}}}
    assert requested_resource(claim, "container-0-request-0", DRIVER) == "nvidia.com/GRID_T4-2Q"
    bad = {"status": {"allocation": {"devices": {"config": [class_config("no slash")]}}}}
    with pytest.raises(VgpuConfigError, match="resourceName"):
        requested_resource(bad, "r", DRIVER)
    odd = class_config("nvidia.com/x")
    odd["opaque"]["parameters"]["colour"] = "red"
    with pytest.raises(VgpuConfigError, match="unknown field 'colour'"):
        requested_resource({"status": {"allocation": {"devices": {"config": [odd]}}}}, "r", DRIVER)


@pytest.mark.parametrize("kind, variable", [("vgpu", "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q"),
                                            ("passthrough", "PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4")])
def test_prepare_sets_the_variable_virt_launcher_reads(tmp_path, paths, kind, variable):
    node = make_node(tmp_path)
    from dra_bridge.pool.devices import PoolPolicy, build_pool
    from mdev_manager.discovery import discover

    pool = build_pool(discover(node.env, node.io), PoolPolicy.default(), server_version=(1, 37))
    gpu = "0000:10:00.0"
    devs = [d for d in devices_of(pool, gpu, kind) if kind != "vgpu" or "T4-2Q" in pool.device(d).type_choices]
    resource = "nvidia.com/GRID_T4-2Q" if kind == "vgpu" else "nvidia.com/TU104GL_TESLA_T4"
    n = 2 if kind == "vgpu" else 1
    claims = DictClaims()
    obj = claim_object("classic", [("container-0-request-0", d) for d in devs[:n]], node=node.node,
                       annotations={EXTENDED_RESOURCE_CLAIM: "true"})
    obj["status"]["allocation"]["devices"]["config"] = [class_config(resource, "T4-2Q" if kind == "vgpu" else None)]
    ref = claims.add(obj, str(uuid.uuid4()))
    drv = make_driver(node, paths, claims, pool)
    res = drv.prepare([ref])[ref.uid]
    assert res.error is None, res.error
    ids = []
    for dev in res.devices:
        spec, cdev = cdi_device(paths.cdi_root, next(i for i in dev.cdi_device_ids if "/claim=" in i))
        assert cdi_problems(spec) == []
        upstream_cdi_validate(spec)
        (entry,) = [e for e in cdev["containerEdits"]["env"] if e.startswith(variable + "=")]
        ids.append(entry.split("=", 1)[1])
    assert len(set(ids)) == 1  # every device carries the whole list
    listed = ids[0].split(",")
    assert len(listed) == n
    from mdev_manager.discovery import discover as rediscover

    g = rediscover(node.env, node.io).gpu(gpu)
    assert set(listed) == ({v.id for v in g.vgpus} if kind == "vgpu" else {gpu})
    # a DRA-native claim of the same class (its config too): no variable (it reads the KEP-5304 metadata)
    drv.unprepare([ref])
    native = claim_object("dra", [("gpu", devs[0])], node=node.node)
    native["status"]["allocation"]["devices"]["config"] = obj["status"]["allocation"]["devices"]["config"]
    plain = claims.add(native, str(uuid.uuid4()))
    out = drv.prepare([plain])[plain.uid]
    spec, cdev = cdi_device(paths.cdi_root, next(i for i in out.devices[0].cdi_device_ids if "/claim=" in i))
    assert "env" not in cdev["containerEdits"]


# --------------------------------------------------------------------------- the simulated cluster


def test_a_classic_vm_and_a_dra_vm_share_one_gpus_counters_on_1_36():
    with SimCluster(render=render, version="1.36", feature_gates={}, health=False,
                    device_classes={"profiles": ["T4-8Q"], "extended_resources": True}) as c:
        dra = c.launch(render_workload(WORKLOADS[0], render), name="vm-t4-a")  # T4-8Q through a claim template
        classic = c.launch([CLASSIC_VM], name="vm-classic")
        assert dra.phase == classic.phase == "Running", (dra.reason, classic.reason)
        (d1,), (d2,) = dra.devices, classic.devices
        assert d1.gpu == d2.gpu and d1.counter_set == d2.counter_set and d1.device != d2.device
        assert d2.env == [f"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-8Q={d2.host_id}"]
        assert c.host_problems(classic) == []  # the mdev virt-launcher found through the variable exists
        # the scheduler's claim: annotated, one request per (container, resource), mapped in the pod status
        (claim,) = [x for x in c.claims() if x["metadata"]["name"] == classic.claims[0][0]]
        assert claim["metadata"]["annotations"] == {EXTENDED_RESOURCE_CLAIM: "true"}
        assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "vgpu-t4-8q"
        pod = c.pod(classic.namespace, classic.pod)
        assert pod["status"]["extendedResourceClaimStatus"]["requestMappings"] == [
            {"containerName": "compute", "resourceName": "nvidia.com/GRID_T4-8Q", "requestName": "container-0-request-0"}]
        # the GPU is full now (2 x T4-8Q): a second classic VM goes to the other T4, a third waits
        more = [c.launch([{**CLASSIC_VM, "metadata": {"name": f"vm-classic-{i}"}}], name=f"vm-classic-{i}")
                for i in range(3)]
        assert [m.phase for m in more] == ["Running", "Running", "Pending"]
        assert {m.devices[0].gpu for m in more[:2]} == {"0000:13:00.0"}
        assert "gpu-0 has 0 B of 16 GiB framebuffer left" in more[2].reason


def test_a_classic_vm_waits_where_the_server_drops_the_mapping():
    with SimCluster(render=render, version="1.35", feature_gates={}, health=False,
                    device_classes={"profiles": ["T4-8Q"], "extended_resources": True}) as c:
        assert not any("extendedResourceName" in x["spec"] for x in c.classes())
        w = c.launch([CLASSIC_VM], name="vm-classic")
        assert w.phase == "Pending" and w.reason == "Insufficient nvidia.com/GRID_T4-8Q" and not w.devices
