from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper

DESCRIPTOR: _descriptor.FileDescriptor

class HealthStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[HealthStatus]
    HEALTHY: _ClassVar[HealthStatus]
    UNHEALTHY: _ClassVar[HealthStatus]
UNKNOWN: HealthStatus
HEALTHY: HealthStatus
UNHEALTHY: HealthStatus

class NodeWatchResourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeWatchResourcesResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceHealth]
    def __init__(self, devices: _Iterable[DeviceHealth | _Mapping] | None = ...) -> None: ...

class DeviceIdentifier(_message.Message):
    __slots__ = ("pool_name", "device_name")
    POOL_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    pool_name: str
    device_name: str
    def __init__(self, pool_name: str | None = ..., device_name: str | None = ...) -> None: ...

class DeviceHealth(_message.Message):
    __slots__ = ("device", "health", "last_updated_time", "health_check_timeout_seconds", "message")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATED_TIME_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    device: DeviceIdentifier
    health: HealthStatus
    last_updated_time: int
    health_check_timeout_seconds: int
    message: str
    def __init__(self, device: DeviceIdentifier | _Mapping | None = ..., health: HealthStatus | str | None = ..., last_updated_time: int | None = ..., health_check_timeout_seconds: int | None = ..., message: str | None = ...) -> None: ...
