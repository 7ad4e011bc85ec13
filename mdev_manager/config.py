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
        - model: L40S             # also: mixedSize: true (several framebuffer sizes, placed exactly),
          vgpus: {L40S-8Q: 4}     # deviceFilter: [0x25B610DE:0x14A910DE] (vgpu-device-manager ids)

``dra`` hands the GPU to the DRA bridge, which creates vGPUs per claim; the manager
only prepares it (driver, VFs). vgpu-device-manager's ``version: v1`` files are read
as they are (``devices: all | [indices]``, ``vgpu-devices: {type: count}``,
``device-filter``), GPU indices counting NVIDIA GPUs only, as NVML does; errors in
them name the file's own fields (``vgpu-configs.<name>[i].vgpu-devices``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from mdev_manager.names import NameError_, check_pci_address, check_type_id, safe_component
from mdev_manager.yamlfile import YamlFileError, load_yaml

Mode = Literal["vgpu", "passthrough", "dra", "unmanaged"]

# Our field -> vgpu-device-manager's, for errors about an entry read from its format
# ("" names the entry itself: it has no field of its own for that).
_DM_FIELDS = {"vgpus": "vgpu-devices", "index": "devices", "all": "devices", "device_filter": "device-filter",
              "deviceFilter": "device-filter"}


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

    ``source`` is the file the layout came from, when it came from one; each problem then
    starts with ``FILE:LINE:`` (see :func:`layout_error`).
    """

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        super().__init__("\n".join(self.problems))


class ConfigFileError(ConfigError):
    """One problem located in a layout file, told in one line: ``FILE[:LINE[:COL]]: what is wrong;
    what is allowed / how to fix``. A file that cannot be read as a layout at all (missing, not
    YAML, a duplicate key) and a layout with a single wrong field both end as one of these."""


def _closest(word: object, choices: Iterable[object]) -> str | None:
    by_lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close and by_lower[close[0]] != str(word) else None


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """``"; did you mean 'mode'?"`` when ``word`` is a close misspelling of one of ``choices``
    (case-insensitive, difflib's ratio >= 0.6), else ``""``."""
    close = _closest(word, choices)
    return f"; did you mean {close!r}?" if close else ""


_SIZED = re.compile(r"^(?P<board>.+)-(?P<size>\d+)(?P<series>[A-Za-z]\w*)$")


def did_you_mean_type(ref: object, names: Iterable[str]) -> str:
    """For a vGPU type that does not exist, the closest sensible ones: the same board and series at the
    nearest sizes below and above (``T4-3Q``: ``T4-2Q`` or ``T4-4Q``, never ``T4-8Q``, which only looks
    alike); else :func:`did_you_mean`. A driver's long name is read by its last word (``NVIDIA RTX Pro
    6000 Blackwell DC-5Q``: ``DC-5Q``)."""
    want = _SIZED.match(str(ref).strip().split()[-1] if str(ref).strip() else "")
    names = list(names)
    if want:
        sizes = {}
        for n in names:
            m = _SIZED.match(n)
            if m and (m["board"].lower(), m["series"].lower()) == (want["board"].lower(), want["series"].lower()):
                sizes[int(m["size"])] = n
        size = int(want["size"])
        below = [sizes[k] for k in sorted(sizes) if k < size][-1:]
        above = [sizes[k] for k in sorted(sizes) if k > size][:1]
        near = below + above
        if near and size not in sizes:
            return "; did you mean " + " or ".join(repr(n) for n in near) + "?"
        boards = {m["board"].lower() for n in names if (m := _SIZED.match(n))}
        if want["board"].lower() not in boards:
            return ""  # another board's type (T4-3Q on an L40S): its look-alike there is no fix
    return did_you_mean(ref, names)


def path_of(loc: Iterable[object]) -> str:
    """A place in a document as its author reads it: ``("layouts", "default", 0, "vgpus")`` ->
    ``layouts.default[0].vgpus``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def _locate(problem: str, file: str, lines: dict[str, int]) -> str:
    """``FILE:LINE: problem``, the line of the longest path the problem starts with."""
    best = ""
    for path in lines:
        if len(path) > len(best) and problem.startswith(path) and problem[len(path):len(path) + 1] in ("", ":", ".", "[", " "):
            best = path
    return f"{file}:{lines[best]}: {problem}" if best else f"{file}: {problem}"


def _located(problems: list[str], file: str, lines: dict[str, int]) -> ConfigError:
    located = [_locate(p, file, lines) for p in problems]
    return (ConfigFileError if len(located) == 1 else ConfigError)(located, source=file)


def layout_error(problems: list[str], layouts: Iterable[GpuLayout] = ()) -> ConfigError:
    """The error for ``problems`` found in ``layouts``: when they were read from a file, each problem
    names the file and line (``FILE:LINE: layouts.default[0].vgpus.T4-3Q: ...``) and a single one
    is a one-line :class:`ConfigFileError`."""
    file, lines = next(((e._file, e._lines) for e in layouts if e._file is not None), (None, None))
    return ConfigError(problems) if file is None else _located(problems, file, lines or {})


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
    mig_mode: bool | Literal["auto"] | None = Field(None, alias="migMode", description=(
        "dra mode: put the GPU in MIG mode (true: the DRA bridge offers MIG-backed vGPUs at their placements) "
        "or out of it (false: time-sliced vGPUs); switched only while the GPU holds nothing. auto: the DRA "
        "bridge offers both, kept apart by compatibility groups where the API server keeps them (else the "
        "current mode only), and the first claim prepared on the empty GPU sets its mode. Unset: as it is. "
        "vgpu mode needs no flag: MIG-backed types in vgpus put the GPU in MIG mode"))
    device_filter: list[str] = Field([], alias="deviceFilter", description=(
        "only GPUs with one of these device ids (vgpu-device-manager's device-filter: 0xDDDDVVVV[:0xSSSSWWWW])"))
    mixed_size: bool = Field(False, alias="mixedSize", description=(
        "run the GPU in NVIDIA's mixed-size mode (as nvidia-smi vgpu -i <gpu> -shm 1), so one layout may hold "
        "several framebuffer sizes: vgpuctl switches an empty GPU through NVML (again after a reboot, in restore) "
        "and places each vGPU at an exact placement; only boards with a known placement table take it. "
        "false leaves the mode as it is"))

    @field_validator("pci_address")
    @classmethod
    def _addr(cls, v: str | None) -> str | None:
        return None if v is None else check_pci_address(v, "pciAddress")

    # Where the entry is written (``layouts.default[0]``, ``vgpu-configs.a100[1]``), in which format,
    # and, when read from a file, the file and the line of every path in it (for layout_error).
    _path: str | None = PrivateAttr(None)
    _dm: bool = PrivateAttr(False)
    _file: str | None = PrivateAttr(None)
    _lines: dict[str, int] | None = PrivateAttr(None)

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
        if not self._dm:
            return _alias(field)
        return _DM_FIELDS.get(field, "")

    def at(self, i: int, field: str = "") -> str:
        """Where ``field`` of the ``i``-th entry is written, for error messages: the path in the file
        (``layouts.default[0].vgpus``); entries made in code have no file and say ``gpus[i]``."""
        base = f"gpus[{i}]" if self._path is None else self._path
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
    def _one_selector(self) -> GpuLayout:
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


ENTRY_FIELDS = [_alias(f) for f in GpuLayout.model_fields]  # as written: index, pciAddress, ...
DOCUMENT_FIELDS = list(NodeConfig.model_fields)
DM_ENTRY_FIELDS = ["devices", "vgpu-devices", "device-filter"]
MODES = list(get_args(Mode))

# ---------------------------------------------------------------- pydantic's findings, in our words

_HINTS = {  # what a mapping / list of a field holds, for "expected a mapping ..." messages
    "layouts": "layout name -> list of entries",
    "vgpus": "vGPU type -> count, e.g. {T4-2Q: 8}",
    "vgpu-devices": "vGPU type -> count, e.g. {T4-2Q: 8}",
}
_ENTRY = "write one as {index: 0, mode: vgpu, vgpus: {T4-2Q: 8}} (select with index, pciAddress, model or all: true)"
_LEADING_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*)([.:])")


def _kind(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing (null)"}.get(type(value), type(value).__name__)


def _explain(e: Mapping[str, Any], base: tuple, fields: list[str], rename: dict[str, str]) -> tuple[str, str, str | None]:
    """One pydantic error as (path as written, message in our words, the field a misspelling
    suggests). Nothing of pydantic's wording ("Input should be", "Extra inputs are not permitted")
    is kept. ``fields``: what the level the error is at allows; ``rename``: our field -> the file's."""
    loc = [rename.get(x, x) if i == 0 and isinstance(x, str) else x for i, x in enumerate(e["loc"])]
    kind, value, ctx = e["type"], e.get("input"), e.get("ctx") or {}
    field = loc[-1] if loc else ""
    suggestion = None
    if loc and loc[-1] == "[key]" and kind == "string_type":
        return path_of(base + tuple(loc[:-2])) or "config", f"the name {loc[-2]!r} is not text; quote it: \"{loc[-2]}\"", None
    if kind == "extra_forbidden":
        suggestion = _closest(field, fields)
        msg = f"unknown field (allowed: {', '.join(fields)}){did_you_mean(field, fields)}"
    elif kind == "missing":
        msg = "required"
    elif kind == "literal_error":
        allowed = MODES if field == "mode" else re.findall(r"'([^']*)'", ctx.get("expected", ""))
        msg = f"{value!r} is not {'a mode' if field == 'mode' else 'allowed'} (allowed: {', '.join(allowed)})" \
              + did_you_mean(value, allowed)
    elif kind in ("int_type", "int_parsing", "int_from_float"):
        msg = f"{value!r} is not a whole number"
    elif kind in ("bool_type", "bool_parsing"):
        msg = f"{value!r} is not true or false"
    elif kind == "greater_than_equal":
        msg = f"{value!r} must be >= {ctx.get('ge')}"
    elif kind in ("model_type", "model_attributes_type") or (kind == "dict_type" and isinstance(field, int)):
        msg = f"{value!r} is not an entry; {_ENTRY}"
    elif kind == "dict_type":
        msg = f"expected a mapping ({_HINTS.get(str(field), 'name: value')}), not {_kind(value)}"
    elif kind == "list_type":
        what = "entries (- index: 0 ...)" if len(loc) == 2 and loc[0] == "layouts" else "values"
        msg = f"expected a list of {what}, not {_kind(value)}"
    elif kind == "string_type":
        msg = f"{value!r} is {_kind(value)}, not text; quote it"
    elif kind == "value_error":  # our own validators' words, which name their field (and key)
        msg = e["msg"].removeprefix("Value error, ")
        m = _LEADING_FIELD.match(msg)
        head = rename.get(m.group(1), m.group(1)) if m else ""
        if m and (head == field or head in fields):
            parent = loc[:-1] if head == field else loc
            rest = head + msg[len(m.group(1)):]
            where, _, msg = rest.partition(": ")
            return path_of(base + tuple(parent)) + "." + where, msg, None
    else:  # a check we have no words of our own for: pydantic's, rephrased
        msg = e["msg"].replace("Input should be", "expected")
    return path_of(base + tuple(loc)), msg, suggestion


def _problems(errors: Sequence[Mapping[str, Any]], base: tuple = (), rename: dict[str, str] | None = None,
              fields: list[str] | None = None) -> list[str]:
    """Every error as ``path: message``; a required field whose misspelling was found is said once.
    Without ``fields``, the errors are our format's (document or entry fields, by depth)."""
    found = []
    for e in errors:
        level = fields or (DOCUMENT_FIELDS if len(e["loc"]) <= 1 else ENTRY_FIELDS)
        found.append(_explain(e, base, level, rename or {}))
    suggested = {p.rsplit(".", 1)[0] + "." + s if "." in p else s for p, _, s in found if s}
    return [f"{p}: {m}" for p, m, _ in found if not (m == "required" and p in suggested)]


def _from_device_manager(doc: dict, name: str) -> list[GpuLayout]:
    """vgpu-device-manager's spec (api/spec/v1): the fields it allows, and the errors it gives, by its names."""
    allowed = ["version", "vgpu-configs"]
    extra = sorted(set(doc) - set(allowed))
    if extra:
        raise ConfigError(f"{extra[0]}: unknown field in a vgpu-device-manager config (allowed: "
                          f"{', '.join(allowed)}){did_you_mean(extra[0], allowed)}")
    if "vgpu-configs" not in doc:
        raise ConfigError("vgpu-configs: required (config name -> list of entries)")
    configs = doc.get("vgpu-configs") or {}
    if not isinstance(configs, dict):
        raise ConfigError("vgpu-configs: expected a mapping of config name -> list of entries")
    if name not in configs:
        names = ", ".join(sorted(str(n) for n in configs)) or "(none)"
        raise ConfigError(f"vgpu-configs: no config named {name!r}; choose one of {names}"
                          f"{did_you_mean(name, [str(n) for n in configs])}")
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
        extra = sorted(set(entry) - set(DM_ENTRY_FIELDS))
        missing = [k for k in ("devices", "vgpu-devices") if k not in entry]
        if extra or missing:
            errors = [{"type": "extra_forbidden", "loc": (k,)} for k in extra]
            errors += [{"type": "missing", "loc": (k,)} for k in missing]
            problems += _problems(errors, ("vgpu-configs", name, i), fields=DM_ENTRY_FIELDS)
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
            problems += _problems(exc.errors(), ("vgpu-configs", name, i), _DM_FIELDS, DM_ENTRY_FIELDS)
            continue
        for layout in made:
            layout._path, layout._dm = where, True
        out += made
    if problems:
        raise ConfigError(problems)
    return out


def parse_config(doc: object, layout: str = "default", *, source: str | None = None,
                 lines: dict[tuple, int] | None = None) -> list[GpuLayout]:
    """The layout entries named ``layout`` from either format; ConfigError names the field as the
    file writes it. With ``source`` (the file) and ``lines`` (its lines by path, from the loader),
    entries remember where they are written, and every problem, here or when the layout is planned
    against a node (:func:`layout_error`), names the file and line."""
    if source is None:
        return _parse(doc, layout)
    where = {path_of(p): n for p, n in (lines or {}).items()}
    try:
        entries = _parse(doc, layout)
    except ConfigError as exc:
        raise _located(exc.problems, source, where) from None
    for i, e in enumerate(entries):
        e._file, e._lines = source, where
        if not e._dm:
            e._path = f"layouts.{layout}[{i}]"
    return entries


def _parse(doc: object, layout: str) -> list[GpuLayout]:
    if not isinstance(doc, dict):
        raise ConfigError(f"config: expected a mapping with 'version' (vgpuctl/v1, or v1 with vgpu-configs), "
                          f"not {_kind(doc)}")
    version = doc.get("version")
    try:
        if version == "v1" and "layouts" in doc and "vgpu-configs" not in doc:
            raise ConfigError("version: 'v1' is vgpu-device-manager's format (vgpu-configs); a file of layouts "
                              "says version: vgpuctl/v1")
        if version == "v1":
            return _from_device_manager(doc, layout)
        if version is None:
            raise ConfigError("version: required; write version: vgpuctl/v1 (or v1 with vgpu-configs)")
        if version != "vgpuctl/v1":
            raise ConfigError(f"version: {version!r} is not known; use 'vgpuctl/v1' (or 'v1' with vgpu-configs)")
        cfg = NodeConfig.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(_problems(exc.errors())) from None
    except NameError_ as exc:
        raise ConfigError(str(exc)) from None
    if layout not in cfg.layouts:
        raise ConfigError(f"layouts: no layout named {layout!r}; choose one of {', '.join(sorted(cfg.layouts))}"
                          f"{did_you_mean(layout, cfg.layouts)}")
    return cfg.layouts[layout]


def load_document(path: Path | str, lines: dict[tuple, int] | None = None) -> object:
    """The layout file as YAML (bounded; duplicate keys, deep nesting, non-text names refused);
    ``lines`` is filled with where each key is written."""
    try:
        return load_yaml(path, what="layout file", lines=lines)
    except YamlFileError as exc:
        raise ConfigFileError(str(exc), source=str(path)) from None


def load_config(path: Path | str, layout: str = "default") -> list[GpuLayout]:
    """The layout ``layout`` of the file at ``path``; every problem names the file and line."""
    lines: dict[tuple, int] = {}
    doc = load_document(path, lines)
    return parse_config(doc, layout, source=str(path), lines=lines)


__all__ = ["ConfigError", "ConfigFileError", "GpuLayout", "NodeConfig", "did_you_mean", "layout_error",
           "load_config", "load_document", "parse_config", "path_of", "check_type_id"]
