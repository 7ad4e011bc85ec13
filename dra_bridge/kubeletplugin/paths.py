"""Where the kubelet plugin keeps its files (one object, as HostEnv is for the host)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dra_bridge.api.names import DEFAULT_DRIVER


@dataclass(frozen=True)
class PluginPaths:
    driver: str = DEFAULT_DRIVER
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_root: Path = Path("/var/run/cdi")

    @property
    def data_dir(self) -> Path:
        return self.kubelet_root / "plugins" / self.driver

    @property
    def checkpoint(self) -> Path:
        return self.data_dir / "checkpoint.json"

    @property
    def metadata_dir(self) -> Path:
        return self.data_dir / "dra-device-metadata"

    @classmethod
    def under(cls, root: Path, driver: str = DEFAULT_DRIVER) -> "PluginPaths":
        root = Path(root)
        return cls(driver=driver, kubelet_root=root / "var/lib/kubelet", cdi_root=root / "var/run/cdi")
