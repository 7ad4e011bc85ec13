"""What the kubelet plugins exchange with their drivers, without gRPC.

The DRA driver (:mod:`dra_bridge.kubeletplugin`) and the classic device plugin's backends
(:mod:`dra_bridge.deviceplugin`) build and return these; only the servers
(:mod:`.dra_grpc`, :mod:`.deviceplugin_grpc`) turn them into protobuf messages. Kept free of
``grpc`` so the drivers can be imported, and tested, without loading it (an import-linter
contract holds ``dra_bridge.kubeletplugin`` to that).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClaimRef(_Model):
    """What the kubelet sends for a claim: its identity only."""

    namespace: str
    uid: str
    name: str


class PreparedDevice(_Model):
    """One prepared device. ``request_names`` may name a firstAvailable sub-request
    (``gpu/a100``, as the allocation result does); the kubelet is answered with the parent."""

    request_names: list[str] = []
    pool_name: str
    device_name: str
    cdi_device_ids: list[str] = []
    share_id: str | None = None


class PrepareResult(_Model):
    devices: list[PreparedDevice] = []
    error: str | None = None


class DeviceHealthRecord(_Model):
    pool: str
    device: str
    healthy: bool | None = None  # None: unknown
    message: str = ""  # why, for people; empty: a default for the status is sent


@runtime_checkable
class DraDriver(Protocol):
    """The driver logic behind :class:`~dra_bridge.rpc.dra_grpc.KubeletPlugin`.

    ``prepare`` returns claim UID -> :class:`PrepareResult`; ``unprepare`` returns
    claim UID -> error message or ``None``. A claim missing from the answer is
    reported to the kubelet as an error. Optionally the driver also has a
    ``health() -> list[DeviceHealthRecord]`` method (see :class:`DraHealthSource`);
    without it ``NodeWatchResources`` answers UNIMPLEMENTED, which the kubelet
    tolerates.
    """

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]: ...

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]: ...


@runtime_checkable
class DraHealthSource(Protocol):
    def health(self) -> list[DeviceHealthRecord]: ...


class RegistrationState(_Model):
    """What the kubelet last answered in NotifyRegistrationStatus, and when."""

    plugin_registered: bool
    error: str = ""
    at: float


# --------------------------------------------------------------------------- classic device plugin


class DpDevice(_Model):
    id: str
    healthy: bool = True
    numa_node: int | None = None


class DeviceSpec(_Model):
    container_path: str
    host_path: str
    permissions: str = "rw"


class MountSpec(_Model):
    container_path: str
    host_path: str
    read_only: bool = False


class ContainerAllocation(_Model):
    envs: dict[str, str] = {}
    devices: list[DeviceSpec] = []
    mounts: list[MountSpec] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []


@runtime_checkable
class DevicePluginBackend(Protocol):
    """The logic behind one extended resource.

    ``wait_for_change`` blocks at most ``timeout`` seconds and returns True when the
    device list or health may have changed (a spurious True is fine: the server only
    sends a new list when it differs). To miss no update it should also return True
    at once when something changed since the calling thread's last ``devices()``
    call (each ListAndWatch stream runs in one thread); the server also re-reads
    ``devices()`` every ``resync_interval`` seconds. ``allocate`` and ``preferred`` may raise; the
    kubelet then gets a gRPC error for that call (it fails the pod admission).
    """

    resource_name: str

    def devices(self) -> list[DpDevice]: ...

    def wait_for_change(self, timeout: float) -> bool: ...

    def allocate(self, device_ids: list[str]) -> ContainerAllocation: ...

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]: ...
