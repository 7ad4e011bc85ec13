"""The driver's published vocabulary (see ``dra_bridge/schema.md``): names, Kubernetes name rules
and quantities that clusters, VMs, manifests and the templates depend on. Pure; imports no
transport, so anything may import it."""
