"""The kinds ``vgpuctl render`` makes, their aliases and keys, as help text.

Generated from kubevirt_templates' input models (``python -m vgpuctl.cli.render_keys`` writes this
file again), so that ``vgpuctl render -h`` loads neither pydantic nor the templates; the test
tests/kubevirt_templates/test_render_keys.py fails whenever a model and this file differ.
"""

# ruff: noqa: E501 (generated help lines)
from __future__ import annotations

#: the environment variable naming KubeVirt's OpenAPI schema (kubevirt_templates.validate.ENV_SCHEMA)
ENV_SCHEMA = "VGPUCTL_KUBEVIRT_OPENAPI"

# --- generated: begin
KINDS = ('vm', 'kubevirt-cr', 'deviceclasses', 'claim-template', 'passthrough-pod')
ALIASES = {'virtualmachine': 'vm', 'kubevirt': 'kubevirt-cr', 'deviceclass': 'deviceclasses', 'resourceclaimtemplate': 'claim-template', 'claimtemplate': 'claim-template', 'pod': 'passthrough-pod'}
KEYS = {
    'vm': (
        "  name                      the VM's name (a DNS label) (required)\n"
        '  namespace                 namespace of the VM (and its claim templates) (default: default)\n'
        '  mode=classic|dra          classic: device-plugin resources (gpus[].deviceName); dra: resource claims (default: classic)\n'
        "  gpus.<TYPE>=N             how many vGPUs of this type (gpus.A100-4C=1; any case; checked against the catalog, or the node's types with --simulate / --inventory) (default: none)\n"
        "  passthrough               a whole GPU: its pci.ids name ('TU104GL [Tesla T4]'); in classic mode a resource name (nvidia.com/TU104GL_TESLA_T4) works too (default: unset)\n"
        '  passthrough_count=N       how many such whole GPUs (1-8) (default: 1)\n'
        "  display=true|false        true: a display on every vGPU, the boot framebuffer (ramfb) on the first only (KubeVirt allows one); false: none; unset: KubeVirt's default (display and ramfb on the first vGPU)\n"
        "  ramfb=true|false          the boot framebuffer (ramFB), on the first vGPU's display only, as KubeVirt refuses it on more than one; unset: KubeVirt's default (on)\n"
        '  cpus=N                    virtual CPU cores (1-512) (default: 2)\n'
        '  memory                    guest memory (a Kubernetes quantity) (default: 4Gi)\n'
        '  image                     containerDisk image the VM boots (default: quay.io/containerdisks/fedora:latest)\n'
        '  user_data                 cloud-init user data; unset: a #cloud-config listing the GPUs\n'
        '  ssh_authorized_keys=[A,B]  SSH public keys for the default user (default: none)\n'
        "  password                  password of the image's default user (console login) (default: unset)\n"
        "  run_strategy=Always|Halted|Manual|RerunOnFailure|Once  the VM's runStrategy (default: Always)\n"
        "  resource_domain           classic mode: the device plugin's resource prefix (default: nvidia.com)\n"
        '  driver                    DRA driver name (default: vgpu.kubevirt.io)\n'
        "  vgpu_class                DeviceClass selecting the driver's vGPUs (default: vgpu.kubevirt.io)\n"
        '  passthrough_class         DeviceClass selecting whole GPUs for passthrough (default: passthrough.vgpu.kubevirt.io)'
    ),
    'kubevirt-cr': (
        "  name                      the KubeVirt CR's name (default: kubevirt)\n"
        "  namespace                 the KubeVirt CR's namespace (default: kubevirt)\n"
        '  inventories=[A,B]         `vgpuctl discover -o yaml` of each GPU node (give them with --inventory FILE, or --simulate) (default: none)\n'
        '  classic=true|false        permit the device-plugin resources (permittedHostDevices) (default: true)\n'
        '  dra=true|false            enable the DRA feature gates (GPUsWithDRA, HostDevicesWithDRA) (default: false)\n'
        '  passthrough=true|false    permit whole GPUs (pciHostDevices) (default: true)\n'
        '  vgpus=true|false          permit vGPU types (mediatedDevices; vendor-VFIO types as pciHostDevices) (default: true)\n'
        '  types=[A,B]               only these vGPU types (id, full or short name); unset: all\n'
        '  include_mig_backed=true|false  also permit MIG-backed vGPU types (need MIG on the GPU) (default: false)\n'
        "  vgpu_live_migration=true|false  enable KubeVirt's vGPU live migration (VGPULiveMigration, alpha in 1.9, with TargetSideMigrationHooks): mdev vGPUs of the device-plugin path only, one per VM; DRA-allocated devices cannot migrate yet (VEP 10). Without inventories the patch leaves permittedHostDevices as the CR has them (default: false)\n"
        '  extra_feature_gates=[A,B]  gates already enabled that must stay (default: none)\n'
        "  resource_domain           the device plugin's resource prefix (default: nvidia.com)"
    ),
    'deviceclasses': (
        "  profiles=[A,B]            vGPU types to give a DeviceClass each (short names, e.g. T4-2Q; a GPU-instance profile such as 1g.5gb too; with extended_resources, a name two boards share (DC-8C) as the driver's full name, or with --inventory) (default: none)\n"
        "  products=[A,B]            GPU products to give a whole-GPU DeviceClass each (pci.ids names, e.g. 'TU104GL [Tesla T4]') (default: none)\n"
        '  extended_resources=true|false  map each per-type and per-product class to the classic resource name (KEP-5004 extendedResourceName, Kubernetes 1.36+: nvidia.com/GRID_T4-2Q, nvidia.com/TU104GL_TESLA_T4) and the whole-GPU class to vfio_resource; VMs with gpus[].deviceName and pods asking for those resources are then served by DRA, on the same counters (default: false)\n'
        "  resource_domain           the classic resources' prefix (default: nvidia.com)\n"
        '  vfio_resource             extended_resources: the name (under resource_domain) of any whole GPU (default: vfio-device)\n'
        '  driver                    DRA driver name (default: vgpu.kubevirt.io)\n'
        "  vgpu_class                DeviceClass selecting the driver's vGPUs (default: vgpu.kubevirt.io)\n"
        '  passthrough_class         DeviceClass selecting whole GPUs for passthrough (default: passthrough.vgpu.kubevirt.io)'
    ),
    'claim-template': (
        "  name                      the template's name; unset: from the selection (vgpu-a100-4c, vgpu-min-8gi, ...)\n"
        '  namespace                 namespace of the template (default: default)\n'
        '  profile                   select a vGPU of this type (short name, e.g. A100-4C; checked against the catalog or the node), or by any profile a device publishes: a GPU-instance profile (1g.5gb) its MIG placements, a GPU model that whole GPU (default: unset)\n'
        '  min_memory                select any vGPU with at least this framebuffer, e.g. 8Gi (default: unset)\n'
        '  first_available=[A,B]     select the first available of these vGPU types, in order of preference (at most 8) (default: unset)\n'
        "  gpu_memory=N              KAI Scheduler's gpu-memory: MiB of framebuffer; the smallest vGPU with at least that much, by firstAvailable over the sizes in ascending order (the hypervisor enforces it, unlike a fraction of a shared GPU) (default: unset)\n"
        "  gpu_fraction              KAI Scheduler's gpu-fraction: this share of the framebuffer of a GPU of `product` (needs product), then as gpu_memory (default: unset)\n"
        '  passthrough=true|false    select a whole GPU (vfio-pci) instead of a vGPU (default: false)\n'
        "  product                   passthrough, gpu_memory or gpu_fraction: the GPU's pci.ids name, e.g. 'TU104GL [Tesla T4]'; unset: any GPU\n"
        "  request_name              the request's name (a VM's requestName); unset: vgpu, or gpu for passthrough\n"
        '  driver                    DRA driver name (default: vgpu.kubevirt.io)\n'
        "  vgpu_class                DeviceClass selecting the driver's vGPUs (default: vgpu.kubevirt.io)\n"
        '  passthrough_class         DeviceClass selecting whole GPUs for passthrough (default: passthrough.vgpu.kubevirt.io)'
    ),
    'passthrough-pod': (
        "  name                      the Pod's name (default: vfio-gpu)\n"
        '  namespace                 namespace of the Pod (and its claim template) (default: default)\n'
        "  image                     the container's image (default: registry.k8s.io/e2e-test-images/busybox:1.36.1-1)\n"
        '  product                   pci.ids name of the GPU; unset: any passthrough GPU\n'
        '  claim_template            an existing ResourceClaimTemplate; unset: render one\n'
        "  command=[A,B]             the container's command (default: list /dev/vfio and the device metadata, then sleep)\n"
        '  driver                    DRA driver name (default: vgpu.kubevirt.io)\n'
        "  vgpu_class                DeviceClass selecting the driver's vGPUs (default: vgpu.kubevirt.io)\n"
        '  passthrough_class         DeviceClass selecting whole GPUs for passthrough (default: passthrough.vgpu.kubevirt.io)'
    ),
}
# --- generated: end


def generated() -> str:
    """This file's generated part, from the models as they are now."""
    from kubevirt_templates.keys import keys_help
    from kubevirt_templates.render import ALIASES, KINDS

    lines = [f"KINDS = {tuple(KINDS)!r}", f"ALIASES = {ALIASES!r}", "KEYS = {"]
    for kind, (model, _) in KINDS.items():
        lines.append(f"    {kind!r}: (")
        text = keys_help(model).split("\n")
        lines += [f"        {line!r}" for line in [line + "\n" for line in text[:-1]] + text[-1:]]
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines)


def _write() -> None:
    from pathlib import Path

    path = Path(__file__)
    text = path.read_text()
    head, rest = text.split("# --- generated: begin\n", 1)
    _, tail = rest.split("# --- generated: end\n", 1)
    path.write_text(f"{head}# --- generated: begin\n{generated()}\n# --- generated: end\n{tail}")


if __name__ == "__main__":
    _write()
