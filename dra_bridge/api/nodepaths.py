"""Where the kubelet and the DRA driver keep their files on a node: one object owns every such path.

The kubelet's root (``--root-dir``, ``/var/lib/kubelet`` by default) decides where plugins register,
where a DRA driver keeps its data and socket, where device plugins and PodResources listen; CDI
specs go under ``/var/run/cdi``. The agent, the kubelet plugin, the device plugin, the CLI and
the simulated kubelet all take their paths from :class:`NodePaths`, as the node manager takes
every host path from ``HostEnv``. Pure: building a path touches nothing.

Layout (kubelet's plugin watcher and DRA plugin conventions, ``../shared/reference/dra.md``):

* ``<kubelet>/plugins_registry/<driver>-reg.sock``: the registration socket the kubelet watches;
* ``<kubelet>/plugins/<driver>/``: the driver's own directory: ``dra.sock``, ``checkpoint.json``,
  ``gpu-ids.json``, ``dra-device-metadata/`` (KEP-5304, read by KubeVirt);
* ``<kubelet>/device-plugins/``: classic device plugins and the kubelet's ``kubelet.sock``;
* ``<kubelet>/pod-resources/kubelet.sock``: the PodResources API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dra_bridge.api import DEFAULT_DRIVER

DEFAULT_KUBELET_ROOT = Path("/var/lib/kubelet")
DEFAULT_CDI_ROOT = Path("/var/run/cdi")


@dataclass(frozen=True)
class NodePaths:
    driver: str = DEFAULT_DRIVER
    kubelet_root: Path = DEFAULT_KUBELET_ROOT
    cdi_root: Path = DEFAULT_CDI_ROOT

    # ---------------------------------------------------------------- the kubelet's
    @property
    def registration_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def registration_socket(self) -> Path:
        return self.registration_dir / f"{self.driver}-reg.sock"

    @property
    def device_plugin_dir(self) -> Path:
        return self.kubelet_root / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    # ---------------------------------------------------------------- the driver's own
    @property
    def data_dir(self) -> Path:
        return self.kubelet_root / "plugins" / self.driver

    @property
    def dra_socket(self) -> Path:
        return self.data_dir / "dra.sock"

    @property
    def checkpoint(self) -> Path:
        return self.data_dir / "checkpoint.json"

    @property
    def gpu_ids(self) -> Path:
        return self.data_dir / "gpu-ids.json"

    @property
    def metadata_dir(self) -> Path:
        return self.data_dir / "dra-device-metadata"

    def owns(self, path: Path | str) -> bool:
        """True for a file the plugin may remove: strictly below the CDI root or the metadata dir."""
        return self.ownership()(path)

    def ownership(self) -> Callable[[Path | str], bool]:
        """:meth:`owns` for a claim's files checked together: the two roots resolved once, not twice per
        file (an unprepare checks about ten paths; each resolve walks every component of a deep path)."""
        roots = [root.resolve() for root in (self.cdi_root, self.metadata_dir)]

        def owns(path: Path | str) -> bool:
            resolved = Path(path).resolve()
            return any(resolved != root and resolved.is_relative_to(root) for root in roots)

        return owns

    def with_(self, **changes: object) -> NodePaths:
        return replace(self, **{k: Path(v) if k != "driver" else v for k, v in changes.items()  # type: ignore[arg-type]
                                if v is not None})

    @classmethod
    def under(cls, root: Path, driver: str = DEFAULT_DRIVER) -> NodePaths:
        """The node's paths below ``root`` (a test's or a simulated node's stand-in for ``/``)."""
        root = Path(root)
        return cls(driver=driver, kubelet_root=root / "var/lib/kubelet", cdi_root=root / "var/run/cdi")
