"""The device attribute names vgpuctl publishes: the vocabulary selectors, DeviceClasses and tools
read. Names without a domain are qualified by the driver's name in CEL
(``device.attributes["vgpu.kubevirt.io"].profile``); the ``resource.kubernetes.io`` ones are the
standard attributes KEP-4381 and the PCI standardisation define. dra_bridge/schema.md documents
each. Pure constants: every producer (the pool builder) and reader (scheduler model, capacity,
conformance) names them from here."""

from __future__ import annotations

# what a device is
ATTR_TYPE = "type"  # "vgpu" | "passthrough"
ATTR_PROFILE = "profile"  # the vGPU's short type name (T4-2Q), a MIG placement's profile, or the GPU's model
ATTR_FRAMEWORK = "framework"  # mdev | vendor-vfio | vfio-pci
ATTR_TYPE_NAME = "typeName"
ATTR_TYPE_ID = "typeId"
ATTR_VGPU_TYPE = "vgpuType"
ATTR_VGPU_TYPES = "vgpuTypes"  # " T4-2A T4-2B T4-2C T4-2Q ": the types a size slot can become
ATTR_SERIES = "series"
ATTR_MIG_BACKED = "migBacked"
ATTR_MIG_ENABLED = "migEnabled"
ATTR_PLACEMENT_START = "placementStart"  # MIG memory slice, or mixed-size vGPU slot (GiB)
ATTR_PLACEMENT_SIZE = "placementSize"
ATTR_VGPU_PLACEMENT = "vgpuPlacement"  # MIG time-slicing: the vGPU's placement id inside its GPU instance

# the physical GPU it is on
ATTR_PRODUCT_NAME = "productName"
ATTR_VENDOR_ID = "vendorId"
ATTR_DEVICE_ID = "deviceId"
ATTR_GPU_INDEX = "gpuIndex"
ATTR_ARCHITECTURE = "architecture"
ATTR_NUMA_NODE = "numaNode"
ATTR_UUID = "uuid"
ATTR_PARENT_UUID = "parentUUID"
ATTR_PARENT_PCI_BUS_ID = "parentPciBusID"

# standard attributes (resource.kubernetes.io)
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
