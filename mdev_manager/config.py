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
        - model: A16              # also: mixedSize: true (a GPU switched with nvidia-smi -shm 1),
          vgpus: {A16-2Q: 8}      # deviceFilter: [0x25B610DE:0x14A910DE] (vgpu-device-manager ids)

``dra`` hands the GPU to the DRA bridge, which creates vGPUs per claim; the manager
only prepares it (driver, VFs). vgpu-device-manager's ``version: v1`` files are read
as they are (``devices: all | [indices]``, ``vgpu-devices: {type: count}``,
``device-filter``), GPU indices counting NVIDIA GPUs only, as NVML does; errors in
them name the file's own fields (``vgpu-configs.<name>[i].vgpu-devices``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, StrictInt, ValidationError, field_validator,
                      model_validator)

from mdev_manager.names import NameError_, check_pci_address, check_type_id, safe_component
from mdev_manager.yamlfile import YamlFileError, load_yaml

Mode = Literal["vgpu", "passthrough", "dra", "unmanaged"]

# Our field -> vgpu-device-manager's, for errors about an entry read from its format
# ("" names the entry itself: it has no field of its own for that).
_DM_FIELDS = {"vgpus": "vgpu-devices", "index": "devices", "all": "devices", "device_filter": "device-filter"}


def parse_device_id(text: str, field: str = "deviceFilter") -> tuple[int, int, int | None, int | None]:
    """vgpu-device-manager's device id: ``0xDDDDVVVV`` or ``0xDDDDVVVV:0xSSSSWWWW``.

    Device and vendor (then subsystem device and vendor), as NVML packs them:
    ``0x1EB810DE`` is a Tesla T4 (device 0x1eb8, vendor 0x10de).
    """
    parts = str(text).split(":")
    try:
        if len(parts) > 2:
            raise ValueError
        ids = [int(x, 0) for x in parts]
        if any(not 0 <= v <= 0xFFFFFFFF for v in ids):
            raise ValueError
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not a device id; write 0xDDDDVVVV (device, vendor), "
                         "e.g. 0x1EB810DE for a Tesla T4, optionally :0xSSSSWWWW for the subsystem") from None
    primary, sub = ids[0], (ids[1] if len(ids) == 2 else None)
    return (primary >> 16, primary & 0xFFFF, None if sub is None else sub >> 16, None if sub is None else sub & 0xFFFF)


class ConfigError(ValueError):
    """Bad input: the message names the field and the fix. Raised before any write.

    ``source`` is the file the layout came from, when it came from one.
    """

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        super().__init__("\n".join(self.problems))


class ConfigFileError(ConfigError):
    """The file cannot be read as a layout at all (missing, a directory, too big, not YAML, a
    duplicate key): one problem, ``FILE[:LINE:COL]: what is wrong; how to fix``."""


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
    device_filter: list[str] = Field([], alias="deviceFilter", description=(
        "only GPUs with one of these device ids (vgpu-device-manager's device-filter: 0xDDDDVVVV[:0xSSSSWWWW])"))
    mixed_size: bool = Field(False, alias="mixedSize", description=(
        "the GPU runs in NVIDIA's mixed-size mode (nvidia-smi vgpu -i <gpu> -shm 1), so one layout may hold "
        "several framebuffer sizes; vgpuctl does not switch the mode"))

    @field_validator("pci_address")
    @classmethod
    def _addr(cls, v: str | None) -> str | None:
        return None if v is None else check_pci_address(v, "pciAddress")

    _source: str | None = PrivateAttr(None)  # the entry's place in a vgpu-device-manager file

    @field_validator("device_filter")
    @classmethod
    def _filter(cls, v: list[str]) -> list[str]:
        for text in v:
            parse_device_id(text)
        return v

    def matches_device(self, vendor_id: str, device_id: str, subsystem_vendor_id: str | None,
                       subsystem_device_id: str | None) -> bool:
        """True without a filter; else when one filter id matches (its subsystem too, if it names one)."""
        if not self.device_filter:
            return True
        hexint = lambda v: int(v, 16) if v else 0  # noqa: E731  sysfs ids read "0x10de"
        for text in self.device_filter:
            dev, ven, sdev, sven = parse_device_id(text)
            if (dev, ven) != (hexint(device_id), hexint(vendor_id)):
                continue
            if sdev is None or (sdev, sven) == (hexint(subsystem_device_id), hexint(subsystem_vendor_id)):
                return True
        return False

    def field_name(self, field: str) -> str:
        """What the admin's file calls ``field`` (our name; vgpu-device-manager's for its entries)."""
        if self._source is None:
            return _alias(field)
        return _DM_FIELDS.get(field, "")

    def at(self, i: int, field: str = "") -> str:
        """Where ``field`` of the ``i``-th entry is in the admin's file, for error messages."""
        base = f"gpus[{i}]" if self._source is None else self._source
        name = self.field_name(field) if field else ""
        return f"{base}.{name}" if name else base

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


def _alias(field: str) -> str:
    """What our format calls a GpuLayout field (``pci_address`` -> ``pciAddress``)."""
    info = GpuLayout.model_fields.get(field)
    return info.alias if info is not None and info.alias else field


def _from_device_manager(doc: dict, name: str) -> list[GpuLayout]:
    """vgpu-device-manager's spec (api/spec/v1): the fields it allows, and the errors it gives, by its names."""
    allowed = {"version", "vgpu-configs"}
    extra = set(doc) - allowed
    if extra:
        raise ConfigError(f"{sorted(extra)[0]}: unknown field in a vgpu-device-manager config (allowed: version, vgpu-configs)")
    configs = doc.get("vgpu-configs") or {}
    if not isinstance(configs, dict):
        raise ConfigError("vgpu-configs: expected a mapping of config name -> list of entries")
    if name not in configs:
        names = ", ".join(sorted(str(n) for n in configs)) or "(none)"
        raise ConfigError(f"vgpu-configs: no config named {name!r}; choose one of {names}")
    entries = configs[name]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"vgpu-configs.{name}: expected a list of at least one entry "
                          "({devices: all | [indices], vgpu-devices: {TYPE: COUNT}})")
    out, problems = [], []
    for i, entry in enumerate(entries):
        where = f"vgpu-configs.{name}[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: {entry!r} is not an entry; write {{devices: all, vgpu-devices: {{{entry}: COUNT}}}}")
            continue
        extra = sorted(set(entry) - {"devices", "vgpu-devices", "device-filter"})
        missing = [k for k in ("devices", "vgpu-devices") if k not in entry]
        if extra or missing:
            problems += [f"{where}.{k}: unknown field (allowed: devices, vgpu-devices, device-filter)" for k in extra]
            problems += [f"{where}.{k}: required" for k in missing]
            continue
        devices, vgpus = entry["devices"], entry["vgpu-devices"] or {}
        dfilter = entry.get("device-filter") or []
        dfilter = [dfilter] if isinstance(dfilter, str) else dfilter
        if not isinstance(dfilter, list) or not all(isinstance(d, str) for d in dfilter):
            problems.append(f"{where}.device-filter: {dfilter!r} must be a device id or a list of them")
            continue
        common = {"mode": "vgpu", "vgpus": vgpus, "nvidia_only": True, "device_filter": dfilter}
        try:
            if devices == "all":
                made = [GpuLayout(all=True, **common)]
            elif isinstance(devices, list) and all(type(d) is int for d in devices):  # not bool
                made = [GpuLayout(index=d, **common) for d in devices]
            else:
                problems.append(f"{where}.devices: {devices!r} must be 'all' or a list of GPU indices")
                continue
        except ValidationError as exc:
            for e in exc.errors():
                msg = e["msg"].removeprefix("Value error, ")
                loc = [str(x) for x in e["loc"]] or [""]
                # our validators name our fields; say the file's names instead
                for field, theirs in _DM_FIELDS.items():
                    ours = _alias(field)
                    if msg.startswith(ours) and msg[len(ours):len(ours) + 1] in (":", "."):
                        msg = theirs + msg[len(ours):]
                        break
                field = ".".join([_DM_FIELDS.get(loc[0], loc[0]), *loc[1:]])
                problems.append(f"{where}.{msg}" if ":" in msg.split(" ")[0] else f"{where}.{field}: {msg}")
            continue
        for layout in made:
            layout._source = where
        out += made
    if problems:
        raise ConfigError(problems)
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
    if e["loc"] and e["loc"][-1] == "[key]" and e["type"] == "string_type":
        where = ".".join(str(x) for x in e["loc"][:-2]) or "config"
        key = e["loc"][-2]
        return f'{where}: the name {key!r} is not text; quote it: "{key}"'
    loc = ".".join(str(x) for x in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc and not msg.startswith(loc.split(".")[-1] + ":") else msg


def load_document(path: Path | str) -> object:
    """The layout file as YAML (bounded; duplicate keys, deep nesting, non-text names refused)."""
    try:
        return load_yaml(path, what="layout file")
    except YamlFileError as exc:
        raise ConfigFileError(str(exc), source=str(path)) from None


def load_config(path: Path | str, layout: str = "default") -> list[GpuLayout]:
    """The layout ``layout`` of the file at ``path``; every ConfigError says which file."""
    doc = load_document(path)
    try:
        return parse_config(doc, layout)
    except ConfigError as exc:
        exc.source = str(path)
        raise


__all__ = ["ConfigError", "ConfigFileError", "GpuLayout", "NodeConfig", "parse_config", "load_config",
           "load_document", "check_type_id"]
