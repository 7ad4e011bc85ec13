"""The kubelet's side of the DRA plugin protocol, over the plugin's unix sockets.

What the kubelet does with a DRA plugin: its plugin watcher finds ``<driver>-reg.sock`` and
calls ``GetInfo`` / ``NotifyRegistrationStatus`` on it (:func:`register_plugin`); then it calls
``NodePrepareResources`` / ``NodeUnprepareResources`` (``v1`` or ``v1beta1``) on the endpoint
the plugin named and watches ``DRAResourceHealth`` (``v1`` or ``v1alpha1``, whichever
:func:`pick_health_service` finds in the plugin's ``supported_versions``) (:class:`DraClient`).
The simulated cluster and the tests drive our plugin through this one client.

The protobuf messages are swappable (``protos``): by default our generated stubs
(:mod:`dra_bridge.rpc.proto`); the tests pass messages compiled at test time from the
upstream kubelet protos (``tests/support/kubelet/protos.py``), so the two sides share only the
wire format and the method paths, as with a real kubelet, and a mistake in our protos cannot
hide on both sides. Calls go through generic gRPC callables built from the method paths below,
which are the kubelet's API and depend on no stub.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from pydantic import BaseModel, ConfigDict

DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1"
DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1"
DRA_PACKAGES = {"v1": DRA_V1, "v1beta1": DRA_V1BETA1}
PLUGIN_REGISTRATION = "pluginregistration"
DRA_HEALTH = "v1alpha1"
DRA_HEALTH_PACKAGES = {"v1": "v1", "v1alpha1": DRA_HEALTH}  # health API version -> proto package
# What a plugin lists in supported_versions for each health version, in the kubelet's order of
# preference (kubernetes/kubelet pkg/apis/dra-health/{v1,v1alpha1}/types.go DRAResourceHealthService;
# the kubelet's pkg/kubelet/cm/dra/plugin pickHealthService takes v1 when both are listed).
HEALTH_SERVICES = {"v1": "v1.DRAResourceHealth", "v1alpha1": "v1alpha1.DRAResourceHealth"}

RPC_TIMEOUT = 5.0


class Protos(Protocol):
    """Where message classes come from: ``message("pluginregistration.InfoRequest")``."""

    def message(self, full_name: str) -> type[Any]: ...


class _Generated:
    """Our generated stubs in :mod:`dra_bridge.rpc.proto`, by full message name."""

    _MODULES = {
        DRA_V1: "vgpuctl_dra_v1_pb2",
        DRA_V1BETA1: "vgpuctl_dra_v1beta1_pb2",
        PLUGIN_REGISTRATION: "vgpuctl_pluginregistration_pb2",
        DRA_HEALTH: "vgpuctl_dra_health_v1alpha1_pb2",
        DRA_HEALTH_PACKAGES["v1"]: "vgpuctl_dra_health_v1_pb2",
    }

    def message(self, full_name: str) -> type[Any]:
        package, _, name = full_name.rpartition(".")
        module = importlib.import_module(f"dra_bridge.rpc.proto.{self._MODULES[package]}")
        return getattr(module, name)


GENERATED: Protos = _Generated()


@dataclass(frozen=True)
class Rpc:
    """One kubelet API method: its path and message names (the contract, not a stub)."""

    service: str  # fully qualified, e.g. "pluginregistration.Registration"
    method: str
    request: str  # fully qualified message names
    response: str
    stream: bool = False

    def callable(self, channel: grpc.Channel, protos: Protos) -> Callable[..., Any]:
        req, resp = protos.message(self.request), protos.message(self.response)
        make = channel.unary_stream if self.stream else channel.unary_unary
        return make(f"/{self.service}/{self.method}", request_serializer=req.SerializeToString,
                    response_deserializer=resp.FromString)


def _registration(method: str, request: str, response: str) -> Rpc:
    p = PLUGIN_REGISTRATION
    return Rpc(f"{p}.Registration", method, f"{p}.{request}", f"{p}.{response}")


GET_INFO = _registration("GetInfo", "InfoRequest", "PluginInfo")
NOTIFY_REGISTRATION = _registration("NotifyRegistrationStatus", "RegistrationStatus", "RegistrationStatusResponse")


def _watch_health(package: str) -> Rpc:
    return Rpc(f"{package}.DRAResourceHealth", "NodeWatchResources", f"{package}.NodeWatchResourcesRequest",
               f"{package}.NodeWatchResourcesResponse", stream=True)


WATCH_HEALTH = {version: _watch_health(package) for version, package in DRA_HEALTH_PACKAGES.items()}


def _dra(package: str, method: str) -> Rpc:
    return Rpc(f"{package}.DRAPlugin", method, f"{package}.{method}Request", f"{package}.{method}Response")


def unix_target(path: Path | str) -> str:
    return f"unix:{os.path.abspath(path)}"


# --------------------------------------------------------------------------- registration


class PluginInfo(BaseModel):
    """A plugin's answer to ``GetInfo``."""

    model_config = ConfigDict(frozen=True)

    type: str
    name: str
    endpoint: str
    supported_versions: list[str]


def pick_health_service(supported_versions: Iterable[str]) -> str | None:
    """The health API version the kubelet watches for a plugin listing ``supported_versions``:
    ``"v1"`` if listed, else ``"v1alpha1"``, else None (no health stream)."""
    listed = set(supported_versions)
    return next((v for v, service in HEALTH_SERVICES.items() if service in listed), None)


def register_plugin(reg_socket: Path | str, refuse: Callable[[PluginInfo], str | None] = lambda info: None, *,
                    timeout: float = RPC_TIMEOUT, protos: Protos = GENERATED) -> tuple[PluginInfo, str | None]:
    """What the kubelet's plugin watcher does with a registration socket: ``GetInfo``, then
    ``NotifyRegistrationStatus`` with the verdict of ``refuse(info)`` (None accepts, a string is
    the error the plugin is refused with). Returns the info and that verdict."""
    with grpc.insecure_channel(unix_target(reg_socket)) as ch:
        get_info = GET_INFO.callable(ch, protos)
        info = get_info(protos.message(GET_INFO.request)(), timeout=timeout, wait_for_ready=True)
        out = PluginInfo(type=info.type, name=info.name, endpoint=info.endpoint,
                         supported_versions=list(info.supported_versions))
        error = refuse(out)
        status = protos.message(NOTIFY_REGISTRATION.request)(plugin_registered=error is None, error=error or "")
        NOTIFY_REGISTRATION.callable(ch, protos)(status, timeout=timeout)
    return out, error


# --------------------------------------------------------------------------- the DRA service


ClaimArg = tuple[str, str, str] | Mapping[str, str]  # (namespace, uid, name) or a dict of those keys


def _claim_fields(claims: Iterable[ClaimArg]) -> list[dict[str, str]]:
    out = []
    for c in claims:
        if isinstance(c, Mapping):
            out.append({"namespace": c["namespace"], "uid": c["uid"], "name": c["name"]})
        else:
            ns, uid, name = c
            out.append({"namespace": ns, "uid": uid, "name": name})
    return out


def _device(d: Any) -> dict[str, Any]:
    has_share = "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id")
    return {"request_names": list(d.request_names), "pool_name": d.pool_name, "device_name": d.device_name,
            "cdi_device_ids": list(d.cdi_device_ids), "share_id": d.share_id if has_share else None}


class DraClient:
    """The kubelet's calls on a DRA plugin's endpoint: prepare, unprepare, the health stream.

    Answers are plain data named as the protos name them: ``prepare`` gives uid ->
    ``{"error", "devices": [{"request_names", "pool_name", "device_name", "cdi_device_ids",
    "share_id"}]}``, ``unprepare`` uid -> error (``""`` when it went well).
    """

    def __init__(self, endpoint: Path | str, version: str = "v1", timeout: float = RPC_TIMEOUT, *,
                 protos: Protos = GENERATED) -> None:
        package = DRA_PACKAGES[version]
        self.version = version
        self.endpoint = Path(endpoint)
        self.timeout = timeout
        self.protos = protos
        self._channel = grpc.insecure_channel(unix_target(self.endpoint))
        self._prepare = _dra(package, "NodePrepareResources").callable(self._channel, protos)
        self._unprepare = _dra(package, "NodeUnprepareResources").callable(self._channel, protos)
        self._prepare_request = protos.message(f"{package}.NodePrepareResourcesRequest")
        self._unprepare_request = protos.message(f"{package}.NodeUnprepareResourcesRequest")
        self._claim = protos.message(f"{package}.Claim")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> DraClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _claims(self, claims: Iterable[ClaimArg]) -> list[Any]:
        return [self._claim(**c) for c in _claim_fields(claims)]

    def prepare(self, claims: Iterable[ClaimArg]) -> dict[str, dict[str, Any]]:
        resp = self._prepare(self._prepare_request(claims=self._claims(claims)), timeout=self.timeout)
        return {uid: {"error": r.error, "devices": [_device(d) for d in r.devices]} for uid, r in resp.claims.items()}

    def unprepare(self, claims: Iterable[ClaimArg]) -> dict[str, str]:
        resp = self._unprepare(self._unprepare_request(claims=self._claims(claims)), timeout=self.timeout)
        return {uid: r.error for uid, r in resp.claims.items()}

    def watch_health(self, timeout: float = 60.0, version: str = "v1") -> Iterator[Any]:
        """The ``NodeWatchResources`` stream of health API ``version`` (``v1`` or ``v1alpha1``);
        iterate it, ``cancel()`` ends it."""
        rpc = WATCH_HEALTH[version]
        return rpc.callable(self._channel, self.protos)(self.protos.message(rpc.request)(), timeout=timeout)

    @staticmethod
    def health_dict(resp: Any) -> dict[tuple[str, str], str]:
        """A ``NodeWatchResourcesResponse`` -> {(pool, device): 'HEALTHY' | 'UNHEALTHY' | 'UNKNOWN'}."""
        out = {}
        for d in resp.devices:
            status = d.DESCRIPTOR.fields_by_name["health"].enum_type.values_by_number[d.health].name
            out[(d.device.pool_name, d.device.device_name)] = status
        return out

    @staticmethod
    def health_messages(resp: Any) -> dict[tuple[str, str], str]:
        """A ``NodeWatchResourcesResponse`` -> {(pool, device): its ``message``}."""
        return {(d.device.pool_name, d.device.device_name): d.message for d in resp.devices}


__all__ = ["DRA_PACKAGES", "DraClient", "GENERATED", "HEALTH_SERVICES", "PluginInfo", "Protos", "Rpc",
           "pick_health_service", "register_plugin", "unix_target"]
