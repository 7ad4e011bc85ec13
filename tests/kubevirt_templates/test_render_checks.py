"""``vgpuctl render`` as a platform engineer meets it (issue #16): the help lists every ``--set``
key of every kind (read off the typed inputs), vGPU types are matched against the catalog or the
node (case-insensitive, written as the node spells them; unknown ones refused with a "did you
mean"), and a VM with several vGPU displays is one KubeVirt admits (ramfb on one vGPU only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kubevirt_templates import render
from kubevirt_templates.inputs import ClaimTemplateInput, VmInput
from kubevirt_templates.keys import keys_help, set_keys
from kubevirt_templates.profiles import KnownTypes, check_types
from kubevirt_templates.render import KINDS, display_options
from kubevirt_templates.validate import ENV_SCHEMA, admission_problems, kubevirt_problems, ramfb_displays
from tests.kubevirt_templates.test_templates import inventory_dict, kubevirt_schema
from vgpuctl.main import main

PYDANTIC_WORDS = ("Input should be", "Extra inputs are not permitted", "errors.pydantic.dev", "Value error")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def helptext(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "-h"])
    assert e.value.code == 0
    return capsys.readouterr().out


# --------------------------------------------------------------------------- the keys in the help


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_field_is_a_key_in_the_help(kind, capsys):
    """Each field of the kind's input model, with its meaning and default, in ``render KIND -h``
    and in ``render -h``: the help is made from the models, so it cannot drift from them."""
    model = KINDS[kind][0]
    own, overview = helptext(capsys, "render", kind), helptext(capsys, "render")
    for key, meaning, default in set_keys(model):
        assert meaning, f"{model.__name__}: the key {key} has no description"
        line = next((ln for ln in own.splitlines() if ln.strip().startswith(key + " ")), None)
        assert line is not None, f"{key} missing from render {kind} -h"
        assert meaning in line and (default in line or "unset:" in meaning), line
        assert line in overview, f"{key} of {kind} missing from render -h"
    for name in model.model_fields:
        assert any(ln.strip().startswith(name) for ln in own.splitlines()), name


def test_keys_show_how_to_write_them():
    keys = {k: (m, d) for k, m, d in set_keys(VmInput)}
    assert keys["gpus.<TYPE>=N"][1] == "none" and keys["name"][1] == "required"
    assert keys["mode=classic|dra"][1] == "classic" and keys["display=true|false"][1] == "unset"
    assert "first only" in keys["display=true|false"][0]  # the ramfb rule is documented
    claim = {k: d for k, _, d in set_keys(ClaimTemplateInput)}
    assert "first_available=[A,B]" in claim and "min_memory" in claim
    assert keys_help(VmInput).splitlines()[0].startswith("  name ")  # the kind's own keys first


# --------------------------------------------------------------------------- vGPU types


KNOWN = KnownTypes((("nvidia-231", "GRID T4-2Q"), ("nvidia-233", "GRID T4-8Q"), ("1152", "NVIDIA L40S-8Q")),
                   source="the test node", listing="list them: nowhere", mig_backed=frozenset({"a100-1-5c"}))


@pytest.mark.parametrize("ref, want", [
    ("t4-8q", "T4-8Q"), ("T4-8Q", "T4-8Q"), ("grid t4-8q", "GRID T4-8Q"), ("nvidia-231", "T4-2Q"),
    ("1152", "L40S-8Q"), ("T4-99Q", None), ("T4", None),
])
def test_types_are_matched_case_insensitively_and_spelt_as_known(ref, want):
    assert KNOWN.canonical(ref) == want


def test_check_types_rewrites_and_refuses():
    values, problems = check_types("vm", {"name": "v", "mode": "dra", "gpus": {"t4-8q": 1, "T4-99Q": 2}}, KNOWN)
    assert values["gpus"] == {"T4-8Q": 1, "T4-99Q": 2}
    (p,) = problems
    assert p == ("gpus.T4-99Q: 'T4-99Q' is not a vGPU type of the test node; did you mean 'T4-8Q' or 'T4-2Q'? "
                 "(list them: nowhere)")
    _, problems = check_types("vm", {"gpus": {"t4-8q": 1, "T4-8Q": 1}}, KNOWN)
    assert problems == ["gpus.T4-8Q: names the same type as gpus.t4-8q (T4-8Q); list each type once"]
    values, problems = check_types("claim-template", {"first_available": ["l40s-8q", "T4-9Q"], "profile": "x"}, KNOWN)
    assert values["first_available"] == ["L40S-8Q", "T4-9Q"]
    assert [p.split(":")[0] for p in problems] == ["profile", "first_available[1]"]
    _, problems = check_types("claim-template", {"profile": "A100-1-5C"}, KNOWN)
    assert "MIG-backed" in problems[0]
    assert check_types("vm", {"gpus": "T4-8Q"}, KNOWN) == ({"gpus": "T4-8Q"}, [])  # the model says what is wrong


@pytest.fixture
def simdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path / "sims"))
    monkeypatch.delenv(ENV_SCHEMA, raising=False)
    return tmp_path / "sims"


def _vm(out: str) -> dict:
    return [d for d in yaml.safe_load_all(out) if d["kind"] == "VirtualMachine"][0]


def test_a_lower_case_type_renders_as_the_catalog_spells_it(simdir, capsys):
    code, out, err = run(capsys, "render", "vm", "--set", "name=v", "--set", "gpus.t4-8q=1")
    assert code == 0, err
    gpus = _vm(out)["spec"]["template"]["spec"]["domain"]["devices"]["gpus"]
    assert [g["deviceName"] for g in gpus] == ["nvidia.com/GRID_T4-8Q"]
    code, out, err = run(capsys, "render", "claim-template", "--set", "profile=a100-4c")
    assert code == 0, err
    (tmpl,) = yaml.safe_load_all(out)
    assert tmpl["metadata"]["name"] == "vgpu-a100-4c"
    assert '.vgpuTypes.contains(" A100-4C ")' in out and 'vgpuType: A100-4C' in out  # selector and config


@pytest.mark.parametrize("argv, key, close", [
    (["render", "vm", "--set", "name=v", "--set", "gpus.T4-99Q=1"], "gpus.T4-99Q", "'T4-8Q'"),
    (["render", "vm", "--set", "name=v", "--set", "mode=dra", "--set", "gpus.A100-4CC=1"], "gpus.A100-4CC", "'A100-4C'"),
    (["render", "claim-template", "--set", "first_available=[A100-8C,L40S-8QQ]"], "first_available[1]", "'L40S-8Q'"),
    (["render", "claim-template", "--set", "profile=T4-2R"], "profile", "'T4-2Q'"),
])
def test_an_unknown_type_is_refused_with_the_closest(argv, key, close, simdir, capsys):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"error: cannot render {argv[1]}: {key}: ") and "not a vGPU type of vgpuctl's catalog" in line
    assert f"did you mean {close}" in line and "--inventory FILE or --simulate" in line, line
    assert not any(w in line for w in PYDANTIC_WORDS)


def test_types_are_checked_against_the_node_with_simulate_or_an_inventory(simdir, tmp_path, capsys):
    """The default simulated node has T4, A100 and L40S: an A16 type exists in the catalog, not there."""
    code, out, err = run(capsys, "--simulate", "render", "vm", "--set", "name=v", "--set", "gpus.l40s-8q=1")
    assert code == 0, err
    assert "nvidia.com/NVIDIA_L40S-8Q" in out
    code, out, err = run(capsys, "render", "vm", "--simulate", "--set", "name=v", "--set", "gpus.A16-2Q=1")
    assert code == 2 and out == ""
    assert err == ("error: cannot render vm: gpus.A16-2Q: 'A16-2Q' is not a vGPU type of the simulated node "
                   "(list them: vgpuctl --simulate discover --types)\n")
    inv = tmp_path / "node.json"
    inv.write_text(json.dumps(inventory_dict()))
    code, out, err = run(capsys, "render", "claim-template", "--inventory", str(inv), "--set", "profile=A16-2Q")
    assert code == 2 and "is not a vGPU type of the given nodes" in err
    code, out, err = run(capsys, "render", "claim-template", "--inventory", str(inv), "--set", "profile=a100-4c")
    assert code == 0 and '" A100-4C "' in out, err


def test_a_mig_backed_type_renders_and_is_refused_where_no_gpu_has_mig(simdir, capsys, tmp_path):
    code, out, err = run(capsys, "render", "vm", "--set", "name=v", "--set", "mode=dra", "--set", "gpus.A100-1-5C=1")
    assert code == 0 and '.vgpuTypes.contains(" A100-1-5C ")' in out and "vgpuType: A100-1-5C" in out, err
    doc = inventory_dict()
    for g in doc["gpus"]:
        g["mig"] = None  # NVML reports no MIG for any GPU of this node
    inv = tmp_path / "node.json"
    inv.write_text(json.dumps(doc))
    code, _, err = run(capsys, "render", "claim-template", "--inventory", str(inv), "--set", "profile=A100-1-5C")
    assert code == 2 and "MIG-backed" in err and "no GPU" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- displays and ramfb


def test_display_options_give_ramfb_to_the_first_vgpu_only():
    assert display_options(None, None, 3) == [(None, None)] * 3  # KubeVirt's default
    assert display_options(True, None, 3) == [(True, None), (True, False), (True, False)]
    assert display_options(True, True, 2) == [(True, True), (True, False)]
    assert display_options(True, False, 2) == [(True, False), (True, False)]
    assert display_options(False, None, 2) == [(False, None), (False, None)]
    assert display_options(None, True, 2) == [(None, True), (None, None)]


@pytest.mark.parametrize("mode", ["classic", "dra"])
@pytest.mark.parametrize("display, ramfb", [(True, None), (True, True), (None, True), (True, False), (False, None)])
def test_several_vgpu_displays_are_admitted(mode, display, ramfb):
    """validateMDEVRamFB (KubeVirt's VMI admitter) refuses more than one vGPU display with ramfb."""
    values = {"name": "v", "mode": mode, "gpus": {"T4-1Q": 2, "T4-2Q": 1}, "display": display, "ramfb": ramfb}
    vm = render("vm", {k: v for k, v in values.items() if v is not None})[-1]
    assert admission_problems(vm) == []
    assert ramfb_displays(vm) == (1 if display is not False and ramfb is not False else 0)


def test_the_admission_rule_is_kubevirts():
    vm = render("vm", {"name": "v", "gpus": {"T4-1Q": 2}, "display": True})[-1]
    gpus = vm["spec"]["template"]["spec"]["domain"]["devices"]["gpus"]
    del gpus[1]["virtualGPUOptions"]["display"]["ramFB"]  # what the template used to render
    assert ramfb_displays(vm) == 2
    (p,) = admission_problems(vm)
    assert "configuring multiple displays with ramfb is not valid" in p
    gpus[1]["virtualGPUOptions"]["display"]["enabled"] = False  # a disabled display does not count
    assert admission_problems(vm) == []


def test_the_cli_refuses_what_kubevirt_would_not_admit(simdir, monkeypatch, capsys):
    """A template bug that slipped through is caught before kubectl apply sees it."""
    import importlib

    monkeypatch.setattr(importlib.import_module("kubevirt_templates.render"), "display_options",
                        lambda d, r, n: [(True, True)] * n)
    code, out, err = run(capsys, "render", "vm", "--set", "name=v", "--set", "gpus.T4-1Q=2")
    assert code == 1 and out == ""
    assert "configuring multiple displays with ramfb is not valid" in err


def test_display_vms_validate_against_kubevirts_schema(simdir, capsys):
    schema = kubevirt_schema()  # skips, saying why, without ../shared/schemas or $VGPUCTL_KUBEVIRT_OPENAPI
    for mode in ("classic", "dra"):
        vm = render("vm", {"name": "v", "mode": mode, "gpus": {"T4-1Q": 3}, "display": True})[-1]
        assert kubevirt_problems(vm, schema) == []
    code, out, err = run(capsys, "render", "vm", "--set", "name=v", "--set", "gpus.t4-1q=2", "--set", "display=true",
                         "--schema", schema.source)
    assert code == 0 and err == "", err


def test_options_go_before_or_after_the_kind(simdir, capsys):
    """``render --set a=1 vm --set b=2``: both count (the kind's parser would drop the first)."""
    code, out, err = run(capsys, "render", "--set", "name=early", "-f", "/dev/null", "vm", "--set", "gpus.T4-1Q=1")
    assert code == 2 and "/dev/null" in err  # a character device is refused, so -f was read
    code, out, err = run(capsys, "render", "--set", "name=early", "vm", "--set", "gpus.T4-1Q=1")
    assert code == 0, err
    assert _vm(out)["metadata"]["name"] == "early"
    code, out, err = run(capsys, "render", "--set", "name=early", "virtualmachine", "--set", "name=late",
                         "--set", "gpus.T4-1Q=1")
    assert code == 0 and _vm(out)["metadata"]["name"] == "late"  # an alias; the later --set wins
