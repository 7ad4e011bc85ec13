"""KubeVirt and DRA objects for vgpuctl: VirtualMachines with vGPUs or passthrough GPUs (device
plugin or DRA form), KubeVirt CR settings, DeviceClasses, ResourceClaimTemplates and a vfio Pod.

``render(kind, values)`` validates ``values`` with the kind's pydantic model (a wrong value
raises :class:`RenderError` naming the field), renders the jinja2 template under
``templates/`` and returns the parsed objects::

    render("vm", {"name": "demo", "mode": "dra", "gpus": {"A100-4C": 1}})
    render("claim-template", ClaimTemplateInput(min_memory="8Gi"))

Kinds: ``vm``, ``kubevirt-cr``, ``deviceclasses``, ``claim-template``, ``passthrough-pod``.
:mod:`~kubevirt_templates.keys` reads each kind's ``--set`` keys off its input model (the CLI's
help), :mod:`~kubevirt_templates.profiles` checks the vGPU types values name against known ones,
:mod:`~kubevirt_templates.validate` checks KubeVirt objects against KubeVirt's schema and admission.
"""

from dra_bridge.api.names import (
    DEFAULT_DRIVER as DRIVER,
)
from dra_bridge.api.names import (
    LABEL_CONFIG,
    LABEL_CONFIG_STATE,
    PASSTHROUGH_CLASS,
    VGPU_CLASS,
    resource_name_for_pci,
    resource_name_for_type,
)
from kubevirt_templates.inputs import (
    ClaimTemplateInput,
    DeviceClassesInput,
    KubeVirtCrInput,
    PassthroughPodInput,
    VmInput,
)
from kubevirt_templates.render import KINDS, RenderError, parse_values, render, render_yaml

__all__ = [
    "ClaimTemplateInput",
    "DRIVER",
    "DeviceClassesInput",
    "KINDS",
    "KubeVirtCrInput",
    "LABEL_CONFIG",
    "LABEL_CONFIG_STATE",
    "PASSTHROUGH_CLASS",
    "PassthroughPodInput",
    "RenderError",
    "VGPU_CLASS",
    "VmInput",
    "parse_values",
    "render",
    "render_yaml",
    "resource_name_for_pci",
    "resource_name_for_type",
]
