"""Load the test client's own .proto files into a private descriptor pool.

The kubelet-side test protos in ``tests/support/kubelet/proto/`` use the same proto packages
and message names as ``dra_bridge/kubelet/proto`` (they must: the package is part of the
gRPC method path). Two files defining the same fully-qualified message cannot both
live in protobuf's default descriptor pool: importing a second generated ``_pb2``
module fails with ``TypeError: Couldn't build proto file into descriptor pool:
duplicate symbol 'v1beta1.Empty'`` (checked with protobuf 7 / upb).

So no ``_pb2`` modules are generated for the test side. Instead the .proto files are
compiled with ``grpc_tools.protoc --descriptor_set_out`` at import time, the
resulting ``FileDescriptorSet`` is added to a *private* ``DescriptorPool`` and
message classes are built from it with ``message_factory``. gRPC calls then go
through generic method handlers/multi-callables with explicit method paths
(``/v1beta1.DevicePlugin/ListAndWatch``), serialising these messages. Both sides
therefore share only the wire format, as with a real kubelet. This module is what the
tests hand :mod:`dra_bridge.kubelet.dra_client` as its ``protos`` (its :func:`message`).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO_DIR = Path(__file__).resolve().parent / "proto"

# package -> short alias used by the test client
DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1"
DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1"
PLUGIN_REGISTRATION = "pluginregistration"
DRA_HEALTH = "v1alpha1"
DEVICE_PLUGIN = "v1beta1"


def _compile() -> bytes:
    from grpc_tools import protoc  # test dependency (grpcio-tools)

    files = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    with tempfile.TemporaryDirectory(prefix="kubelet-protos-") as tmp:
        out = Path(tmp) / "set.binpb"
        rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", *files])
        if rc != 0:
            raise RuntimeError(f"protoc failed ({rc}) on {files}")
        return out.read_bytes()


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    fds = descriptor_pb2.FileDescriptorSet.FromString(_compile())
    p = descriptor_pool.DescriptorPool()
    for f in fds.file:
        p.AddSerializedFile(f.SerializeToString())
    return p


@functools.cache
def message(full_name: str) -> type[Any]:
    """Message class for e.g. ``v1beta1.RegisterRequest`` from the private pool."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))


def enum_value(full_enum: str, name: str) -> int:
    return pool().FindEnumTypeByName(full_enum).values_by_name[name].number


def enum_name(full_enum: str, number: int) -> str:
    return pool().FindEnumTypeByName(full_enum).values_by_number[number].name


class Method:
    """One RPC of the private pool: path plus (de)serialisers."""

    def __init__(self, service: str, method: str) -> None:
        svc = pool().FindServiceByName(service)
        m = svc.methods_by_name[method]
        self.path = f"/{service}/{method}"
        self.request = message_factory.GetMessageClass(m.input_type)
        self.response = message_factory.GetMessageClass(m.output_type)
        self.server_streaming = m.server_streaming

    def unary(self, channel: Any) -> Any:
        return channel.unary_unary(
            self.path, request_serializer=self.request.SerializeToString, response_deserializer=self.response.FromString
        )

    def stream(self, channel: Any) -> Any:
        return channel.unary_stream(
            self.path, request_serializer=self.request.SerializeToString, response_deserializer=self.response.FromString
        )
