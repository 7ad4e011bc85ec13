"""The doctor's checks: facts read from a cluster (:mod:`dra_bridge.apiclient.clusterfacts`) in, one
finding per line out, each PASS / WARN / FAIL with the fix. Pure: the tests feed facts directly.

FAIL means the accounting is not safe or the driver cannot work (the scheduler could hand out one
GPU twice, or claims cannot be allocated); WARN means something works less well than it could.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from dra_bridge.api.compat import (
    COMPATIBILITY_GROUPS_SINCE,
    OLDEST,
    POOL_NAME_COUNTERS_BUG,
    POOL_NAME_COUNTERS_FIXED,
    counters_keyed_by_pool_name,
    format_version,
)
from dra_bridge.api.names import (
    AGENT_SELECTOR,
    ANNOTATION_CONFIG_REASON,
    DEPLOY_NAMESPACE,
    LABEL_CONFIG_STATE,
    PASSTHROUGH_CLASS,
    VGPU_CLASS,
)
from dra_bridge.apiclient.clusterfacts import ClusterFacts
from dra_bridge.apiclient.kept import KeptFields

Status = Literal["PASS", "WARN", "FAIL"]
_STATE_STATUS: dict[str, Status] = {"success": "PASS", "pending": "WARN", "failed": "FAIL"}  # the agent's state label

#: KubeVirt's feature gates for devices through DRA (kubevirt.md: alpha v1.6-v1.8, beta v1.9).
KUBEVIRT_DRA_GATES = ("GPUsWithDRA", "HostDevicesWithDRA")


class Finding(BaseModel):
    status: Status
    check: str
    detail: str
    fix: str | None = None


def _server(f: ClusterFacts) -> list[Finding]:
    if f.version is None:
        return [Finding(status="FAIL", check="API server", detail="no version answer")]
    ok = f.version >= OLDEST
    return [Finding(status="PASS" if ok else "FAIL", check="API server",
                    detail=f"Kubernetes {f.git_version or '{}.{}'.format(*f.version)}",
                    fix=None if ok else f"upgrade to Kubernetes {format_version(OLDEST)} or later (resource.k8s.io/v1)")]


def _fields(f: ClusterFacts) -> list[Finding]:
    if f.version is None or f.version < OLDEST:
        return []
    if f.probe_error:
        return [Finding(status="WARN", check="DRA fields kept", detail=f"could not probe: {f.probe_error}",
                        fix="run the doctor as a user who may create resourceslices (its probe is a dry run: nothing "
                            "is stored)")]
    out = []
    k = f.kept
    if k.counters is False:
        out.append(Finding(status="FAIL", check="shared counters",
                           detail="the server drops sharedCounters/consumesCounters: without them a whole GPU and "
                                  "its vGPUs are independent devices to the scheduler",
                           fix="enable the DRAPartitionableDevices feature gate on kube-apiserver and kube-scheduler "
                               "(alpha in 1.34-1.35; beta and on by default from 1.36)"))
    else:
        out.append(Finding(status="PASS", check="shared counters", detail="kept (one counter set per physical GPU)"))
    by_binding = k.counters is not False and bool(k.binding_conditions)
    if f.version < COMPATIBILITY_GROUPS_SINCE:
        out.append(Finding(status="PASS", check="compatibility groups",
                           detail=f"not in Kubernetes {f.version[0]}.{f.version[1]}: " + (
                               "sizes are kept apart by binding conditions instead" if by_binding else
                               "one vGPU size per GPU is offered at a time")))
    elif k.compatibility_groups is False:
        out.append(Finding(status="PASS" if by_binding else "WARN", check="compatibility groups",
                           detail="the server drops compatibilityGroups: " + (
                               "sizes are kept apart by binding conditions instead" if by_binding else
                               "only one vGPU size per GPU can be offered"),
                           fix=None if by_binding else
                           "enable the DRADeviceCompatibilityGroups feature gate (alpha in 1.37) on "
                           "kube-apiserver and kube-scheduler, and restart the agents"))
    else:
        # Checked against Kubernetes' own allocator (tests/oracle): a kube-scheduler without the gate
        # ignores every slice that names groups, so the node's pool is incomplete and nothing on it is
        # allocated. A dry-run probe sees the API server's gates only, not the scheduler's.
        out.append(Finding(status="WARN", check="compatibility groups",
                           detail="kept: every vGPU size is offered; kube-scheduler must have "
                                  "DRADeviceCompatibilityGroups on too (alpha, off by default in 1.37): without "
                                  "it the scheduler ignores every slice that names groups, the node's pool counts "
                                  "as incomplete and none of its GPUs is allocated",
                           fix="check kube-scheduler's --feature-gates (e.g. kubectl get pods -A -l "
                               "component=kube-scheduler -o yaml | grep feature-gates) and add "
                               "DRADeviceCompatibilityGroups=true, or turn the gate off on kube-apiserver and restart "
                               "the agents"))
    out.append(Finding(status="PASS" if k.binding_conditions else "WARN", check="binding conditions",
                       detail="kept (kube-scheduler needs DRADeviceBindingConditions and DRAResourceClaimDeviceStatus "
                              "on too, as by default from 1.36, or it allocates no device that has them)"
                       if k.binding_conditions else "dropped (DRADeviceBindingConditions is off)",
                       fix=None if k.binding_conditions else
                       "enable DRADeviceBindingConditions (beta, on by default from 1.36)"))
    out.append(Finding(status="PASS" if k.counters is not False else "WARN", check="published shape",
                       detail=published_shape(f.version, k)))
    return out


def _pool_names(f: ClusterFacts) -> list[Finding]:
    """kubernetes#140434: on 1.35.x and 1.36.0-1.36.3 the allocator shares counter sets between two
    drivers' pools of one name on a node (both publish their pool under the node's name by convention)."""
    if f.version is None or f.kept.counters is False or not counters_keyed_by_pool_name(f.git_version):
        return []
    fixed = " or ".join(".".join(map(str, r)) for r in POOL_NAME_COUNTERS_FIXED)
    fix = (f"upgrade kube-scheduler (and the control plane) to Kubernetes {fixed} or later; the allocator of "
           f"{f.git_version} keys shared counters by pool name alone ({POOL_NAME_COUNTERS_BUG})")
    if f.pool_name_clashes:
        return [Finding(status="FAIL", check="pool names",
                        detail=f"{', '.join(f.pool_name_clashes)} publish counter sets under a pool name of "
                               f"{f.driver}: this server's scheduler counts their devices and ours against one "
                               "another's counters, so a GPU can be refused or handed out twice",
                        fix=fix)]
    return [Finding(status="WARN", check="pool names",
                    detail=f"no other driver publishes counters under a pool name of {f.driver} now; one that does "
                           "(e.g. NVIDIA's DRA driver on the same node, pools named after the node) would share "
                           "counters with it on this scheduler",
                    fix=fix)]


def published_shape(version: tuple[int, int], k: KeptFields) -> str:
    """What the agents publish for a server keeping ``k`` (dra_bridge/schema.md), in words."""
    if k.counters is False:
        return ("safe shape: per GPU the whole GPU or one vGPU type's slots, never both (no counters to "
                "account them together)")
    if version >= COMPATIBILITY_GROUPS_SINCE and k.compatibility_groups is not False:
        return "every vGPU size, one counter set per GPU, sizes apart by compatibility groups"
    if k.binding_conditions:
        return ("every vGPU size of an empty GPU, one counter set per GPU; the agent confirms each allocation's "
                "size before the scheduler binds it (binding conditions)")
    return "one vGPU size per GPU (the configured or present one), one counter set per GPU"


def _kubevirt(f: ClusterFacts) -> list[Finding]:
    kv = f.kubevirt
    if kv.error:
        return [Finding(status="WARN", check="KubeVirt", detail=f"could not read the KubeVirt CR: {kv.error}")]
    if not kv.installed:
        return [Finding(status="WARN", check="KubeVirt", detail="not installed (no kubevirt.io/v1 KubeVirt)",
                        fix="install KubeVirt v1.8 or later for VMs; pods can use the devices without it")]
    out = [Finding(status="PASS", check="KubeVirt", detail=f"installed, version {kv.version or 'unknown'}")]
    missing = [g for g in KUBEVIRT_DRA_GATES if g not in kv.feature_gates]
    out.append(Finding(
        status="WARN" if missing else "PASS", check="KubeVirt DRA gates",
        detail=f"missing {', '.join(missing)}" if missing else ", ".join(KUBEVIRT_DRA_GATES) + " on",
        fix=None if not missing else "add them to spec.configuration.developerConfiguration.featureGates "
                                     "(vgpuctl render kubevirt-cr prints the settings)"))
    mdev = kv.mdev_configuration
    if mdev is not None and mdev.get("enabled") is not False:
        out.append(Finding(status="FAIL", check="KubeVirt mdev management",
                           detail="mediatedDevicesConfiguration is set without enabled: false: virt-handler creates "
                                  "and removes vGPUs itself and will fight the node agent",
                           fix="set spec.configuration.mediatedDevicesConfiguration.enabled: false"))
    else:
        out.append(Finding(status="PASS", check="KubeVirt mdev management",
                           detail="virt-handler leaves vGPUs to the node agent"))
    return out


def _classes(f: ClusterFacts) -> list[Finding]:
    if f.classes_error:
        return [Finding(status="WARN", check="DeviceClasses", detail=f"could not list: {f.classes_error}")]
    names = {c.name for c in f.classes if c.ours}
    missing = [c for c in (VGPU_CLASS, PASSTHROUGH_CLASS) if c not in {x.name for x in f.classes}]
    if missing:
        return [Finding(status="FAIL", check="DeviceClasses", detail=f"missing {', '.join(missing)}",
                        fix="`kubectl apply -k deploy/overlays/dra` (or `vgpuctl render deviceclasses | kubectl apply "
                            "-f -`)")]
    return [Finding(status="PASS", check="DeviceClasses", detail=f"{len(names)} select driver {f.driver}")]


def _nodes(f: ClusterFacts) -> list[Finding]:
    if f.nodes_error:
        return [Finding(status="WARN", check="GPU nodes", detail=f"could not list: {f.nodes_error}")]
    if not f.nodes:
        return [Finding(status="WARN", check="GPU nodes", detail=f"no node publishes devices of {f.driver}",
                        fix=f"check that the agent runs on the GPU nodes: `{agent_pods()}`")]
    out = []
    for n in f.nodes:
        if not n.node_object:
            out.append(Finding(status="WARN", check=f"node {n.name}",
                               detail=f"the API server has no Node object {n.name!r} (deleted, renamed, or never "
                                      f"registered), yet {n.slices} slices, {n.devices} devices of {f.driver} name "
                                      "it: the scheduler cannot use them",
                               fix=f"where no agent runs for it any more, `kubectl delete resourceslices "
                                   f"--field-selector spec.nodeName={n.name}`; where one does, set its NODE_NAME "
                                   "to its Node's name, as kubectl get nodes lists it"))
            continue
        state = n.state or "unlabelled"
        status = _STATE_STATUS.get(n.state or "", "WARN")
        if n.slices == 0:
            status = "FAIL" if status == "PASS" else status
        detail = f"layout {n.layout or '-'}, {LABEL_CONFIG_STATE}={state}, {n.slices} slices, {n.devices} devices"
        if n.fields:
            detail += f"; the agent found the server keeps {n.fields}"
        if n.reason:
            detail += f"; {n.reason}"
        reason_path = f"{{.metadata.annotations.{_escaped(ANNOTATION_CONFIG_REASON)}}}"
        fix = {"pending": f"release the devices its {ANNOTATION_CONFIG_REASON} annotation names: "
                          f"`kubectl get node {n.name} -o jsonpath='{reason_path}'`",
               "failed": f"read the agent's log and fix the layout it names: `{agent_logs(n.name)}`"}.get(n.state or "")
        if n.slices == 0 and fix is None:
            fix = f"the agent publishes nothing: read its log: `{agent_logs(n.name)}`"
        out.append(Finding(status=status, check=f"node {n.name}", detail=detail, fix=fix))
    return out


def agent_pods() -> str:
    return f"kubectl -n {DEPLOY_NAMESPACE} get pods -l {AGENT_SELECTOR} -o wide"


def agent_logs(node: str) -> str:
    """The agent's log on ``node``, as deploy/ installs it (one pod of the DaemonSet per node)."""
    return (f"kubectl -n {DEPLOY_NAMESPACE} logs --tail=100 $(kubectl -n {DEPLOY_NAMESPACE} get pods -l {AGENT_SELECTOR} "
            f"--field-selector spec.nodeName={node} -o name)")


def _escaped(key: str) -> str:
    """A label or annotation key in a kubectl JSONPath (dots escaped)."""
    return key.replace(".", "\\.")


def diagnose(facts: ClusterFacts) -> list[Finding]:
    """Every finding, in the order an admin fixes things: server, fields, KubeVirt, classes, nodes."""
    return _server(facts) + _fields(facts) + _pool_names(facts) + _kubevirt(facts) + _classes(facts) + _nodes(facts)


def exit_code(findings: list[Finding]) -> int:
    """0: nothing failed; 1: a FAIL (warnings alone do not fail)."""
    return 1 if any(x.status == "FAIL" for x in findings) else 0
