"""A prepared claim's files: its CDI spec, its metadata files and their CDI specs, from its devices
as the host shows them (moved out of the driver: pure wiring of :mod:`.cdi` and :mod:`.metadata`)."""

from __future__ import annotations

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.kubeletplugin import cdi, claimfiles, metadata
from dra_bridge.kubeletplugin.effects import PrepareError
from dra_bridge.kubeletplugin.resourceenv import resource_env
from dra_bridge.kubeletplugin.state import ClaimRecord, PreparedDeviceRecord
from mdev_manager.discovery import read_function
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, link_name


def vfio_of(env: HostEnv, io: HostIO, d: PreparedDeviceRecord) -> tuple[int | None, str | None, dict]:
    """(IOMMU group, vfio cdev name, metadata attributes) of a prepared device, as the host shows it."""
    if d.kind == "vgpu":
        if d.vgpu_id is None:
            raise PrepareError(f"device {d.device}: no vGPU recorded for it")
        link = env.mdev_devices / d.vgpu_id if d.framework == "mdev" else env.pci(d.vgpu_id)
        group = link_name(io, link / "iommu_group")
        cdevs = io.listdir(link / "vfio-dev")  # with iommufd: the vGPU's own vfio cdev
        attrs = {"mdevUUID": {"string": d.vgpu_id}} if d.framework == "mdev" else \
            {"resource.kubernetes.io/pciBusID": {"string": d.vgpu_id}}
        return (int(group) if group and group.isdigit() else None), (cdevs[0] if cdevs else None), attrs
    fn = read_function(env, io, d.gpu)  # the GPU's own group and cdev: no need to read its VFs
    return fn["iommu_group"], fn["vfio_dev"], {"resource.kubernetes.io/pciBusID": {"string": d.gpu}}


def write_files(env: HostEnv, io: HostIO, paths: NodePaths, rec: ClaimRecord, claim: dict) -> None:
    """The claim's CDI spec, metadata files and their CDI specs, from its devices on the host;
    only for the claim the API server holds under that name now (the metadata path is shared
    by name: the newest claim owns it, see :mod:`.claimfiles`)."""
    if claim["metadata"].get("uid") != rec.uid:
        raise PrepareError(f"claim {rec.namespace}/{rec.name} is now uid {claim['metadata'].get('uid')}, not "
                           f"{rec.uid}: no files are written for the claim it replaced")
    cdi_devices: dict[str, list[dict]] = {}
    by_request: dict[str, list[dict]] = {}
    rec.cdi_files, rec.metadata_files = [], []
    for d in rec.devices:
        d.iommu_group, vfio_dev, attrs = vfio_of(env, io, d)
        cdi_devices[d.device] = cdi.vfio_nodes(env, d.iommu_group, vfio_dev, io.exists(env.iommufd))
        d.cdi_ids = [cdi.cdi_id(paths.driver, rec.uid, d.device)]
        by_request.setdefault(d.request, []).append(
            {"driver": paths.driver, "pool": d.pool, "name": d.device, "attributes": attrs})
    spec_file = cdi.spec_path(paths.cdi_root, paths.driver, rec.uid)
    cdi.write_spec(io, spec_file, cdi.claim_spec(paths.driver, rec.uid, cdi_devices,
                                                 resource_env(rec, claim, paths.driver)))
    rec.cdi_files.append(str(spec_file))
    for request, devices in by_request.items():
        host = metadata.host_file(paths.metadata_dir, rec.namespace, rec.name, request)
        claimfiles.write_metadata(io, paths, host, metadata.document(claim, request, devices), request)
        rec.metadata_files.append(str(host))
        spec, mid = metadata.cdi_spec(paths.driver, rec.uid, request, host,
                                      metadata.container_path(paths.driver, claim, request))
        mpath = metadata.cdi_path(paths.cdi_root, paths.driver, rec.uid, request)
        cdi.write_spec(io, mpath, spec)
        rec.cdi_files.append(str(mpath))
        # On the request's first device only, as the upstream helper injects it
        # (k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go, NodePrepareResources:
        # "Inject metadata CDI device IDs into the first device per request"): the runtime
        # bind-mounts the file once per container, not once per device.
        next(d for d in rec.devices if d.request == request).cdi_ids.append(mid)
