"""The KAR-0003 / KAR-0004 conformance checks, on the simulated cluster or a real one."""

#: the workload image (needs sh); here, not in backend, so `vgpuctl conformance -h` loads none of the checks
DEFAULT_IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"
