"""The driver's published vocabulary (see ``dra_bridge/schema.md``): names, Kubernetes name rules
and quantities that clusters, VMs, manifests and the templates depend on. Pure; imports no
transport, so anything may import it."""

#: the DRA driver's name (also ``dra_bridge.api.names.DEFAULT_DRIVER``): here, so a command's ``--driver``
#: option costs no import of the vocabulary's modules
DEFAULT_DRIVER = "vgpu.kubevirt.io"
