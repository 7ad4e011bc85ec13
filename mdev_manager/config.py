"""The admin's declared layout, in our format or NVIDIA vgpu-device-manager's.

Our format (``version: vgpuctl/v1``)::

    version: vgpuctl/v1
    layouts:
      default:
        - index: 0                # or pciAddress, model, or all: true
          mode: vgpu              # vgpu | passthrough | dra | unmanaged
          vgpus: {T4-2Q: 4, "GRID T4-1Q": 8}
        - pciAddress: "0000:16:00.0"
          mode: passthrough

``dra`` hands the GPU to the DRA bridge, which creates vGPUs per claim; the manager
only prepares it (driver, VFs). vgpu-device-manager's ``version: v1`` files are read
as they are (``devices: all | [indices]``, ``vgpu-devices: {type: count}``), GPU
indices counting NVIDIA GPUs only, as NVML does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from .names import NameError_, check_pci_address, check_type_id, safe_component

Mode = Literal["vgpu", "passthrough", "dra", "unmanaged"]


class ConfigError(ValueError):
    """Bad input: the message names the field and the fix. Raised before any write."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class GpuLayout(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    index: StrictInt | None = Field(None, ge=0)
    pci_address: str | None = Field(None, alias="pciAddress")
    model: str | None = None
    all: bool | None = None
    nvidia_only: bool = Field(False, alias="nvidiaOnly", description="index counts NVIDIA GPUs only")
    mode: Mode = "vgpu"
    vgpus: dict[str, StrictInt] = {}  # strict: YAML's `yes` is not a count
    passthrough: bool = Field(False, description="dra mode: also offer the whole GPU for passthrough")
    mixed_size: bool = Field(False, alias="mixedSize", description=(
        "the GPU runs in NVIDIA's mixed-size mode (nvidia-smi vgpu -i <gpu> -shm 1), so one layout may hold "
        "several framebuffer sizes; vgpuctl does not switch the mode"))

    @field_validator("pci_address")
    @classmethod
    def _addr(cls, v: str | None) -> str | None:
        return None if v is None else check_pci_address(v, "pciAddress")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        return None if v is None else safe_component(v, "model")

    @field_validator("vgpus")
    @classmethod
    def _vgpus(cls, v: dict[str, int]) -> dict[str, int]:
        for name, count in v.items():
            if "/" in name or ".." in name or "\x00" in name:
                raise ValueError(f"vgpus: {name!r} cannot be a vGPU type name (no '/' or '..')")
            if not isinstance(count, int) or count < 0:
                raise ValueError(f"vgpus.{name}: count {count!r} must be a whole number >= 0")
        return v

    @model_validator(mode="after")
    def _one_selector(self) -> "GpuLayout":
        chosen = [k for k in ("index", "pci_address", "model") if getattr(self, k) is not None]
        chosen += ["all"] if self.all is True else []
        if len(chosen) != 1:
            raise ValueError("select a GPU with exactly one of index, pciAddress, model or all: true")
        if self.mode not in ("vgpu", "dra") and self.vgpus:
            raise ValueError(f"vgpus: only mode vgpu or dra takes vGPU types, this entry has mode {self.mode}")
        if self.mode not in ("vgpu", "dra") and self.mixed_size:
            raise ValueError(f"mixedSize: only mode vgpu or dra holds vGPUs, this entry has mode {self.mode}")
        return self

    def describe(self) -> str:
        if self.all:
            return "all"
        if self.index is not None:
            return f"index {self.index}"
        return f"pciAddress {self.pci_address}" if self.pci_address else f"model {self.model!r}"


class NodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal["vgpuctl/v1"] = "vgpuctl/v1"
    layouts: dict[str, list[GpuLayout]]


def _from_device_manager(doc: dict, name: str) -> list[GpuLayout]:
    allowed = {"version", "vgpu-configs"}
    extra = set(doc) - allowed
    if extra:
        raise ConfigError(f"{sorted(extra)[0]}: unknown field in a vgpu-device-manager config (allowed: version, vgpu-configs)")
    configs = doc.get("vgpu-configs") or {}
    if name not in configs:
        raise ConfigError(f"vgpu-configs: no config named {name!r}; choose one of {', '.join(sorted(configs)) or '(none)'}")
    out = []
    for i, entry in enumerate(configs[name] or []):
        if not isinstance(entry, dict) or set(entry) - {"devices", "vgpu-devices"}:
            raise ConfigError(f"vgpu-configs.{name}[{i}]: only 'devices' and 'vgpu-devices' are allowed")
        devices = entry.get("devices", "all")
        vgpus = entry.get("vgpu-devices") or {}
        if devices == "all":
            out.append(GpuLayout(all=True, mode="vgpu", vgpus=vgpus, nvidia_only=True))
        elif isinstance(devices, list) and all(type(d) is int for d in devices):  # not bool
            out += [GpuLayout(index=d, mode="vgpu", vgpus=vgpus, nvidia_only=True) for d in devices]
        else:
            raise ConfigError(f"vgpu-configs.{name}[{i}].devices: {devices!r} must be 'all' or a list of GPU indices")
    return out


def parse_config(doc: object, layout: str = "default") -> list[GpuLayout]:
    """The layout entries named ``layout`` from either format; ConfigError names the field."""
    if not isinstance(doc, dict):
        raise ConfigError("config: expected a mapping with 'version'")
    version = doc.get("version")
    try:
        if version == "v1" and "vgpu-configs" in doc:
            return _from_device_manager(doc, layout)
        if version != "vgpuctl/v1":
            raise ConfigError(f"version: {version!r} is not known; use 'vgpuctl/v1' (or 'v1' with vgpu-configs)")
        cfg = NodeConfig.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError([_pydantic_problem(e) for e in exc.errors()]) from None
    except NameError_ as exc:
        raise ConfigError(str(exc)) from None
    if layout not in cfg.layouts:
        raise ConfigError(f"layouts: no layout named {layout!r}; choose one of {', '.join(sorted(cfg.layouts))}")
    return cfg.layouts[layout]


def _pydantic_problem(e: dict) -> str:
    loc = ".".join(str(x) for x in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc and not msg.startswith(loc.split(".")[-1] + ":") else msg


def load_config(path: Path | str, layout: str = "default") -> list[GpuLayout]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({exc})") from None
    return parse_config(doc, layout)


__all__ = ["ConfigError", "GpuLayout", "NodeConfig", "parse_config", "load_config", "check_type_id"]
