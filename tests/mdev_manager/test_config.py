"""Layout files: our vgpuctl/v1 format and vgpu-device-manager's v1, and every malformed input.

Errors must name the field and the reason; anything that could reach a sysfs path
(PCI addresses, models, type names) is refused when the file is read.
"""

from __future__ import annotations

import pytest
import yaml

from mdev_manager.config import ConfigError, ConfigFileError, did_you_mean, layout_error, load_config, parse_config
from tests.support.simnodes import EXAMPLE_LAYOUT

V = "vgpuctl/v1"
PYDANTIC_WORDS = ("Input should be", "Extra inputs are not permitted", "Field required", "pydantic", "Value error")


def ours(*entries, name="default"):
    return {"version": V, "layouts": {name: list(entries)}}


def problems(doc, name="default") -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(doc, name)
    assert e.value.problems, "a ConfigError must carry at least one problem"
    return e.value.problems


def one_problem(doc, name="default") -> str:
    p = problems(doc, name)
    assert len(p) == 1, p
    return p[0]


# --------------------------------------------------------------------------- our format
def test_example_layout_parses():
    default = load_config(EXAMPLE_LAYOUT)
    doc = yaml.safe_load(EXAMPLE_LAYOUT.read_text())
    assert len(default) == len(doc["layouts"]["default"])
    for entry, raw in zip(default, doc["layouts"]["default"], strict=False):
        assert entry.mode == raw["mode"]
        assert entry.vgpus == raw.get("vgpus", {})
        assert entry.index == raw.get("index")
        assert entry.pci_address == raw.get("pciAddress")
        assert entry.model == raw.get("model")
        assert entry.nvidia_only is False
    dra = load_config(EXAMPLE_LAYOUT, "dra")
    assert len(dra) == 1 and dra[0].all is True and dra[0].mode == "dra"


@pytest.mark.parametrize("given,canonical", [
    ("0000:65:00.0", "0000:65:00.0"),
    ("65:00.0", "0000:65:00.0"),
    ("0000:AF:00.0", "0000:af:00.0"),
    (" 0000:65:00.1 ", "0000:65:00.1"),
])
def test_pci_address_is_normalised(given, canonical):
    (entry,) = parse_config(ours({"pciAddress": given, "mode": "passthrough"}))
    assert entry.pci_address == canonical


def test_selectors_and_modes():
    entries = parse_config(ours({"index": 2, "mode": "dra", "vgpus": {"A100-4C": 2}, "passthrough": True},
                                {"model": "Tesla T4", "mode": "unmanaged"},
                                {"all": True, "mode": "passthrough"}))
    assert [e.describe() for e in entries] == ["index 2", "model 'Tesla T4'", "all"]
    assert entries[0].passthrough is True and entries[0].vgpus == {"A100-4C": 2}
    assert entries[0].mode == "dra"
    # vgpu is the default mode
    (e,) = parse_config(ours({"index": 0}))
    assert e.mode == "vgpu" and e.vgpus == {}


def test_named_layouts():
    doc = {"version": V, "layouts": {"small": [{"index": 0, "vgpus": {"T4-1Q": 16}}],
                                     "big": [{"index": 0, "vgpus": {"T4-16Q": 1}}]}}
    assert parse_config(doc, "small")[0].vgpus == {"T4-1Q": 16}
    assert parse_config(doc, "big")[0].vgpus == {"T4-16Q": 1}
    p = one_problem(doc, "medium")
    assert p.startswith("layouts:") and "'medium'" in p and "big" in p and "small" in p


# --------------------------------------------------------------------------- bad input: our format
@pytest.mark.parametrize("entry,field,reason", [
    ({"index": 0, "pciAddress": "0000:10:00.0"}, "layouts.default[0]", "exactly one of"),
    ({"mode": "vgpu"}, "layouts.default[0]", "exactly one of"),
    ({"all": False}, "layouts.default[0]", "exactly one of"),
    ({"index": 0, "vgpu": {"T4-1Q": 1}}, "layouts.default[0].vgpu", "unknown field (allowed: index, pciAddress"),
    ({"index": 0, "mode": "pass"}, "layouts.default[0].mode", "(allowed: vgpu, passthrough, dra, unmanaged)"),
    ({"index": 0, "mode": "passthrough", "vgpus": {"T4-1Q": 1}}, "layouts.default[0].vgpus", "only mode vgpu or dra"),
    ({"index": 0, "mode": "unmanaged", "vgpus": {"T4-1Q": 1}}, "layouts.default[0].vgpus", "only mode vgpu or dra"),
    ({"index": 0, "vgpus": {"T4-1Q": -1}}, "layouts.default[0].vgpus.T4-1Q", ">= 0"),
    ({"index": 0, "vgpus": {"T4-1Q": "four"}}, "layouts.default[0].vgpus.T4-1Q", "not a whole number"),
    ({"index": 0, "vgpus": {"T4-1Q": 2.5}}, "layouts.default[0].vgpus.T4-1Q", "not a whole number"),
    ({"index": 0, "vgpus": {"T4-1Q": True}}, "layouts.default[0].vgpus.T4-1Q", "not a whole number"),
    ({"index": 0, "vgpus": ["T4-1Q"]}, "layouts.default[0].vgpus", "expected a mapping (vGPU type -> count"),
    ({"index": -1}, "layouts.default[0].index", "-1 must be >= 0"),
    ({"index": True}, "layouts.default[0].index", "True is not a whole number"),
    ({"pciAddress": "0000:zz:00.0"}, "layouts.default[0].pciAddress", "not a PCI address"),
    ({"pciAddress": "0000:65:00.8"}, "layouts.default[0].pciAddress", "not a PCI address"),
])
def test_bad_entries_name_the_field(entry, field, reason):
    """The path as the file writes it (``layouts.default[0].vgpus``), the reason in our words."""
    p = one_problem(ours(entry))
    assert p.startswith(f"{field}: "), p
    assert reason in p, p
    assert not any(w in p for w in PYDANTIC_WORDS), p


@pytest.mark.parametrize("entry,field", [
    # anything that could be joined to a sysfs path
    ({"pciAddress": "../../../etc"}, "pciAddress"),
    ({"pciAddress": "0000:65:00.0/../../x"}, "pciAddress"),
    ({"pciAddress": "/sys/bus/pci/devices/0000:65:00.0"}, "pciAddress"),
    ({"model": "../etc"}, "model"),
    ({"model": ".."}, "model"),
    ({"model": "T4/../../x"}, "model"),
    ({"model": "T4\x00"}, "model"),
    ({"model": "T4\n"}, "model"),
    ({"index": 0, "vgpus": {"../x": 1}}, "vgpus"),
    ({"index": 0, "vgpus": {"..": 1}}, "vgpus"),
    ({"index": 0, "vgpus": {"nvidia-222/../../../x": 1}}, "vgpus"),
    ({"index": 0, "vgpus": {"/etc/passwd": 1}}, "vgpus"),
    ({"index": 0, "vgpus": {"nvidia-222\x00": 1}}, "vgpus"),
])
def test_hostile_names_are_refused(entry, field):
    p = one_problem(ours(entry))
    assert field in p.split(":")[0], p
    bad = next(iter(entry.get("vgpus", {}))) if "vgpus" in entry else entry.get("pciAddress", entry.get("model"))
    assert repr(bad) in p or bad in p, p  # the offending value is quoted back


def test_every_problem_is_reported_at_once():
    p = problems(ours({"index": -1}, {"pciAddress": "nope"}, {"index": 0, "mode": "x"}))
    assert len(p) == 3
    assert any(x.startswith("layouts.default[0].index:") for x in p)
    assert any(x.startswith("layouts.default[1].pciAddress:") for x in p)
    assert any(x.startswith("layouts.default[2].mode:") for x in p)


@pytest.mark.parametrize("doc,field", [
    ({"layouts": {}}, "version"),
    ({"version": "v2", "layouts": {}}, "version"),
    ({"version": V}, "layouts"),
    ({"version": V, "layouts": {"default": [{"index": 0}]}, "gpus": []}, "gpus"),
    ({"version": V, "layouts": {"default": {"index": 0}}}, "layouts.default"),
    ({"version": V, "layouts": {"default": ["T4"]}}, "layouts.default[0]"),
    ([{"index": 0}], "config"),
    ("version: vgpuctl/v1", "config"),
    (None, "config"),
])
def test_bad_documents(doc, field):
    p = problems(doc)
    assert any(x.startswith(field) for x in p), p


def test_load_config_file_errors(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "missing.yaml")
    assert "missing.yaml" in str(e.value) and "No such file" in str(e.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: vgpuctl/v1\nlayouts: {default: [index: 0\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert "bad.yaml" in str(e.value) and "not valid YAML" in str(e.value)
    assert str(e.value).startswith(f"{bad}:3:1: ")  # FILE:LINE:COL


def test_load_config_refuses_duplicate_keys_and_numbers_for_names(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("version: vgpuctl/v1\nlayouts:\n  default:\n    - index: 0\n  default:\n    - index: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(dup)
    assert e.value.problems == [f"{dup}:5:3: duplicate key 'default' (first at line 3); keep one of them"]
    num = tmp_path / "num.yaml"
    num.write_text("version: vgpuctl/v1\nlayouts:\n  1:\n    - index: 0\n")
    with pytest.raises(ConfigError) as e:
        load_config(num, "1")
    assert e.value.problems == [f'{num}:3:3: the key 1 is read as a number (1), not as a name; quote it: "1"']


def test_names_that_are_not_text():
    """Parsed elsewhere (not through the loader): still one problem naming the fix."""
    assert problems({"version": "vgpuctl/v1", "layouts": {1: [{"index": 0}]}}, "1") == [
        'layouts: the name 1 is not text; quote it: "1"']
    dm = {"version": "v1", "vgpu-configs": {1: [{"devices": "all", "vgpu-devices": {"T4-1Q": 1}}]}}
    assert problems(dm, "x") == ["vgpu-configs: no config named 'x'; choose one of 1"]


# --------------------------------------------------------------------------- vgpu-device-manager v1
# The shape of NVIDIA's examples/config-t4.yaml (vgpu-device-manager).
DM_CONFIG = """
version: v1
vgpu-configs:
  T4-1Q:
    - devices: all
      vgpu-devices:
        "T4-1Q": 16
  T4-small:
    - devices: [0]
      vgpu-devices:
        "T4-1Q": 16
    - devices: [1]
      vgpu-devices:
        "T4-2Q": 8
  T4-pair:
    - devices: [0, 1]
      vgpu-devices:
        "T4-4Q": 4
"""


def test_device_manager_config_with_a_selected_name(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(DM_CONFIG)
    (entry,) = load_config(path, "T4-1Q")
    assert entry.all is True and entry.vgpus == {"T4-1Q": 16}
    assert entry.nvidia_only is True  # indices and 'all' count NVIDIA GPUs only, as NVML does
    small = load_config(path, "T4-small")
    assert [(e.index, e.vgpus) for e in small] == [(0, {"T4-1Q": 16}), (1, {"T4-2Q": 8})]
    assert all(e.nvidia_only and e.mode == "vgpu" for e in small)
    pair = load_config(path, "T4-pair")
    assert [(e.index, e.vgpus) for e in pair] == [(0, {"T4-4Q": 4}), (1, {"T4-4Q": 4})]


def test_device_manager_unknown_name_lists_the_choices():
    p = one_problem(yaml.safe_load(DM_CONFIG), "T4-huge")
    assert p.startswith("vgpu-configs:") and "'T4-huge'" in p
    for name in ("T4-1Q", "T4-small", "T4-pair"):
        assert name in p


@pytest.mark.parametrize("doc,field,reason", [
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": "some", "vgpu-devices": {"T4-1Q": 1}}]}},
     "vgpu-configs.a[0].devices", "'all' or a list"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": [True], "vgpu-devices": {"T4-1Q": 1}}]}},
     "vgpu-configs.a[0].devices", "'all' or a list"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": [0], "vgpu-devices": {}, "extra": 1}]}},
     "vgpu-configs.a[0].extra", "unknown field (allowed: devices, vgpu-devices, device-filter)"),
    ({"version": "v1", "vgpu-configs": {"a": ["T4-1Q"]}}, "vgpu-configs.a[0]",
     "write {devices: all, vgpu-devices: {T4-1Q: COUNT}}"),
    ({"version": "v1", "vgpu-configs": {"a": [{"vgpu-devices": {"T4-1Q": 1}}]}}, "vgpu-configs.a[0].devices", "required"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": "all"}]}}, "vgpu-configs.a[0].vgpu-devices", "required"),
    ({"version": "v1", "vgpu-configs": {"a": []}}, "vgpu-configs.a", "at least one entry"),
    ({"version": "v1", "vgpu-configs": {"a": []}, "other": 1}, "other", "unknown field"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": [-1], "vgpu-devices": {"T4-1Q": 1}}]}},
     "vgpu-configs.a[0].devices", "-1 must be >= 0"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": "all", "vgpu-devices": {"T4-1Q": -2}}]}},
     "vgpu-configs.a[0].vgpu-devices.T4-1Q", ">= 0"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": "all", "vgpu-devices": {"../../x": 1}}]}},
     "vgpu-configs.a[0].vgpu-devices", "cannot be a vGPU type name"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": "all", "vgpu-devices": {}, "device-filter": "T4"}]}},
     "vgpu-configs.a[0].device-filter", "0x1EB810DE"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": "all", "vgpu-devices": {}, "device-filter": [7]}]}},
     "vgpu-configs.a[0].device-filter", "a device id or a list"),
])
def test_device_manager_bad_input(doc, field, reason):
    p = one_problem(doc, "a")
    assert p.startswith(field), p
    assert reason in p, p



# --------------------------------------------------------------------------- one error style (issue #16)
@pytest.mark.parametrize("doc, name, want", [
    (ours({"index": 0, "mdoe": "vgpu"}), "default",
     "layouts.default[0].mdoe: unknown field (allowed: index, pciAddress, model, all, nvidiaOnly, mode, vgpus, "
     "passthrough, migMode, deviceFilter, mixedSize); did you mean 'mode'?"),
    (ours({"index": 0, "mode": "passthru"}), "default",
     "layouts.default[0].mode: 'passthru' is not a mode (allowed: vgpu, passthrough, dra, unmanaged); "
     "did you mean 'passthrough'?"),
    (ours({"index": 0, "mixedsize": True}), "default", "did you mean 'mixedSize'?"),
    ({"version": V, "layout": {"default": [{"index": 0}]}}, "default",
     "layout: unknown field (allowed: version, layouts); did you mean 'layouts'?"),
    (ours({"index": 0}), "defualt", "layouts: no layout named 'defualt'; choose one of default; did you mean 'default'?"),
    ({"version": "v1", "vgpu-configs": {"a": [{"devices": "all", "vgpu-device": {"T4-1Q": 1}}]}}, "a",
     "vgpu-configs.a[0].vgpu-device: unknown field (allowed: devices, vgpu-devices, device-filter); "
     "did you mean 'vgpu-devices'?"),
    ({"version": "v1", "vgpu-config": {}}, "a", "did you mean 'vgpu-configs'?"),
])
def test_a_misspelling_gets_one_problem_with_a_suggestion(doc, name, want):
    """One problem, not also "required" for the field that was meant."""
    p = one_problem(doc, name)
    assert p == want or p.endswith(want), p


@pytest.mark.parametrize("doc", [
    ours({"index": "0"}), ours({"index": 0, "vgpus": "T4-1Q"}), ours({"index": 0, "all": "yes please"}),
    ours({"index": 0, "deviceFilter": 5}), ours({"model": 7}), ours(5), {"version": V, "layouts": []},
    {"version": V, "layouts": {"default": None}}, ours({"index": 0, "mode": None}), ours({"index": 1.5}),
])
def test_no_pydantic_wording_leaks(doc):
    for p in problems(doc):
        assert not any(w in p for w in PYDANTIC_WORDS), p
        assert p.startswith(("layouts", "version")), p


def test_problems_in_a_file_name_the_file_and_line(tmp_path):
    path = tmp_path / "layout.yaml"
    path.write_text("version: vgpuctl/v1\nlayouts:\n  default:\n    - index: 0\n      vgpus:\n        T4-1Q: x\n"
                    "    - index: 1\n      colour: red\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.source == str(path)
    assert e.value.problems == [f"{path}:6: layouts.default[0].vgpus.T4-1Q: 'x' is not a whole number",
                                f"{path}:8: layouts.default[1].colour: unknown field (allowed: index, pciAddress, "
                                "model, all, nvidiaOnly, mode, vgpus, passthrough, migMode, deviceFilter, mixedSize)"]
    path.write_text("version: vgpuctl/v1\nlayouts:\n  default:\n    - index: 0\n      mode: vgpus\n")
    with pytest.raises(ConfigFileError) as e:  # one problem: one line
        load_config(path)
    assert str(e.value) == (f"{path}:5: layouts.default[0].mode: 'vgpus' is not a mode (allowed: vgpu, passthrough, "
                            "dra, unmanaged); did you mean 'vgpu'?")


def test_entries_from_a_file_know_where_they_are_written(tmp_path):
    """Planning against a node (plan.py) names the entry as the file writes it, with its line."""
    path = tmp_path / "layout.yaml"
    path.write_text("version: vgpuctl/v1\nlayouts:\n  big:\n    - index: 0\n      vgpus:\n        T4-3Q: 1\n")
    (entry,) = load_config(path, "big")
    assert entry.at(0, "vgpus") == "layouts.big[0].vgpus" and entry.at(0, "mixed_size") == "layouts.big[0].mixedSize"
    err = layout_error(["layouts.big[0].vgpus.T4-3Q: not offered", "layouts.big[0] (index 0): busy"], [entry])
    assert err.problems == [f"{path}:6: layouts.big[0].vgpus.T4-3Q: not offered", f"{path}:4: layouts.big[0] (index 0): busy"]
    assert not isinstance(err, ConfigFileError) and err.source == str(path)
    one = layout_error(["layouts.big[0].vgpus: too many"], [entry])
    assert isinstance(one, ConfigFileError) and str(one) == f"{path}:5: layouts.big[0].vgpus: too many"
    (coded,) = parse_config(ours({"index": 0}))  # made in code: no file, positions
    assert coded.at(0, "vgpus") == "gpus[0].vgpus"
    assert layout_error(["gpus[0]: x"], [coded]).problems == ["gpus[0]: x"]
    dm = tmp_path / "dm.yaml"
    dm.write_text("version: v1\nvgpu-configs:\n  a:\n    - devices: [0, 1]\n      vgpu-devices: {T4-1Q: 1}\n")
    entries = load_config(dm, "a")
    assert [e.at(i, "vgpus") for i, e in enumerate(entries)] == ["vgpu-configs.a[0].vgpu-devices"] * 2
    assert str(layout_error(["vgpu-configs.a[0].vgpu-devices.T4-1Q: no"], entries)) == \
        f"{dm}:5: vgpu-configs.a[0].vgpu-devices.T4-1Q: no"


def test_did_you_mean():
    assert did_you_mean("mdoe", ["index", "mode"]) == "; did you mean 'mode'?"
    assert did_you_mean("MODE", ["mode"]) == "; did you mean 'mode'?"  # a case slip
    assert did_you_mean("mode", ["mode"]) == ""  # nothing to correct
    assert did_you_mean("colour", ["index", "mode"]) == ""


def test_the_version_tells_the_format():
    assert one_problem({"version": "v1", "layouts": {"default": [{"index": 0}]}}).startswith(
        "version: 'v1' is vgpu-device-manager's format")
    assert one_problem({"version": "v1"}, "a") == "vgpu-configs: required (config name -> list of entries)"
    assert one_problem({"layouts": {}}).startswith("version: required; write version: vgpuctl/v1")
