"""The classic kubelet device plugin (``deviceplugin/v1beta1``) for KubeVirt VMs.

What admins run today is NVIDIA's kubevirt-gpu-device-plugin; VMs name its resources in
``spec.domain.devices.gpus[].deviceName`` / ``hostDevices[].deviceName``. This package
advertises the node manager's vGPUs and passthrough GPUs under the same names, so those
VMs keep working when vgpuctl takes over:

- one resource per vGPU type name, spaces to ``_`` (``nvidia.com/GRID_T4-1Q``,
  ``nvidia.com/NVIDIA_A100-4C``); mdev vGPUs have their UUID as device id, vendor-specific
  VFIO vGPUs (a VF with ``nvidia/current_vgpu_type`` set) their VF's PCI address;
- one resource per passthrough GPU model (a GPU PF bound to ``vfio-pci``), named from
  pci.ids the way NVIDIA's plugin names it (``TU104GL [Tesla T4]`` ->
  ``nvidia.com/TU104GL_TESLA_T4``), else from the hex device id; device id = PCI address.

Modules: :mod:`.resources` (inventory -> resources, pure), :mod:`.backend` (one resource's
live health, ``Allocate`` and preferred allocation), :mod:`.manager` (one gRPC server per
resource, kept registered). The names are in :mod:`dra_bridge.api.names`, the host watch in
:mod:`mdev_manager.host.watch`, the gRPC server in :mod:`dra_bridge.rpc.deviceplugin_grpc`.
"""
