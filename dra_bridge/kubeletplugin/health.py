"""Each published device's health for the kubelet's health service (as dra-example-driver's
``health.go``): a device is as healthy as its GPU."""

from __future__ import annotations

from collections.abc import Mapping

from dra_bridge.pool.devices import Pool
from dra_bridge.rpc.types import DeviceHealthRecord
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO


def device_health(pool: Pool, pool_name: str, sick: Mapping[str, str], env: HostEnv,
                  io: HostIO) -> list[DeviceHealthRecord]:
    """Healthy: the device's GPU is present on the PCI bus, and ``sick`` (GPU -> why, from the agent's
    health watch: a critical Xid, ECC pages pending, lost, unmonitored) holds nothing against it; the
    message says which GPU and why. The bus is read once per GPU."""
    present: dict[str, bool] = {}
    out = []
    for dev in pool.devices:
        if dev.gpu not in present:
            present[dev.gpu] = io.exists(env.pci(dev.gpu))
        if not present[dev.gpu]:
            healthy, message = False, f"GPU {dev.gpu} is gone from the PCI bus"
        elif dev.gpu in sick:
            healthy, message = False, f"GPU {dev.gpu} is unhealthy: {sick[dev.gpu]}"
        else:
            healthy, message = True, f"GPU {dev.gpu} present"
        out.append(DeviceHealthRecord(pool=pool_name, device=dev.name, healthy=healthy, message=message))
    return out
