"""``vgpuctl`` on simulated hosts, through ``vgpuctl.main``."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from mdev_manager import catalog, persist
from mdev_manager.sim import load_host, preset_names
from tests.support.simnodes import EXAMPLE_LAYOUT, file_tree, open_sim
from vgpuctl.main import main


@pytest.fixture
def simdir(tmp_path, monkeypatch):
    d = tmp_path / "sims"
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(d))
    return d


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err



def test_discover_table_json_yaml(simdir, capsys):
    code, table, _ = run(capsys, "--simulate", "discover")
    assert code == 0
    sim = open_sim(simdir / "default")  # the CLI keeps its simulated host there
    inv = sim.discover()
    spec = load_host("default")
    assert table.splitlines()[0] == f"Node {spec.node}: {len(inv.gpus)} GPUs"
    for g in inv.gpus:
        assert any(line.split()[:2] == [str(g.index), g.address] for line in table.splitlines())

    code, out, _ = run(capsys, "--simulate", "discover", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["node"] == spec.node
    assert [g["address"] for g in data["gpus"]] == [g.address for g in inv.gpus]
    assert [g["framework"] for g in data["gpus"]] == [g.framework for g in inv.gpus]
    assert [len(g["types"]) for g in data["gpus"]] == [len(g.types) for g in inv.gpus]

    code, out, _ = run(capsys, "--simulate", "discover", "-o", "yaml")
    assert code == 0
    assert yaml.safe_load(out) == data

    code, out, _ = run(capsys, "--simulate", "discover", "--types")
    assert code == 0
    for t in inv.gpus[0].types:
        assert t.id in out and t.name in out


def test_plan_changes_nothing(simdir, capsys):
    run(capsys, "--simulate", "discover")
    before = file_tree(simdir / "default")
    code, out, _ = run(capsys, "--simulate", "plan", "-f", str(EXAMPLE_LAYOUT))
    assert code == 0
    assert out.startswith("Plan:")
    inv = open_sim(simdir / "default").discover()
    a100 = catalog.board("A100-40GB")
    a100_addr = next(g.address for g in inv.gpus if g.device_id == a100.device_id)
    rows = {line.split()[1]: line for line in out.splitlines()[2:] if line[:1].isdigit()}
    assert "bind to vfio-pci" in rows[inv.gpus[1].address]
    assert f"enable {a100.sriov_total_vfs} VFs" in rows[a100_addr] and "then 6 x A100-4C" in rows[a100_addr]
    assert "discovers the GPUs again" in out
    assert out.strip().splitlines()[-1].startswith("19 steps to take; nothing was changed")
    # every step with -v
    code, out, _ = run(capsys, "--simulate", "plan", "-f", str(EXAMPLE_LAYOUT), "-v")
    assert code == 0 and out.startswith("Steps:")
    assert f"bind {inv.gpus[1].address} to vfio-pci" in out
    assert f"enable {a100.sriov_total_vfs} SR-IOV VFs on {a100_addr}" in out
    assert file_tree(simdir / "default") == before


def test_plan_has_no_dry_run(simdir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--simulate", "plan", "-f", str(EXAMPLE_LAYOUT), "--dry-run"])
    _, err = capsys.readouterr()
    assert exc.value.code == 2
    assert "--dry-run is apply's option: plan never changes the node" in err
    # apply keeps it, and prints the plan
    code, out, _ = run(capsys, "--simulate", "apply", "-f", str(EXAMPLE_LAYOUT), "--dry-run")
    assert code == 0 and out.startswith("Plan:") and "nothing was changed" in out.splitlines()[-1]


def test_apply_then_apply_again_says_zero_changes(simdir, capsys):
    code, out, err = run(capsys, "--simulate", "plan", "-f", str(EXAMPLE_LAYOUT))
    planned = int(out.strip().splitlines()[-1].split()[0])
    assert code == 0 and "these are round 1's steps" in " ".join(out.split()), out
    code, out, err = run(capsys, "--simulate", "apply", "-f", str(EXAMPLE_LAYOUT), "-v")
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    n = int(last.split()[0])
    assert n > 0 and last.endswith("changes; node matches the layout")
    # plan counts round 1's steps, apply every round's: it says how many in each (19 and 39 read as a contradiction)
    rounds = out.strip().splitlines()[-2]
    assert rounds == f"steps taken: {planned} in round 1 (the steps plan counts), {n - planned} in round 2", out
    assert out.count("[ok]") == n and "FAILED" not in out
    sim = open_sim(simdir / "default")
    inv = sim.discover()
    # one change per vGPU and per definition or record at least
    assert n >= 2 * len(inv.all_vgpus())
    assert len(sim.definitions()) == sum(1 for v in inv.all_vgpus() if v.framework == "mdev")

    before = file_tree(simdir / "default")
    code, out, _ = run(capsys, "--simulate", "apply", "-f", str(EXAMPLE_LAYOUT), "-v")
    assert code == 0
    assert out.strip().splitlines()[-1] == "0 changes; node matches the layout"
    assert "nothing to change" in out
    assert file_tree(simdir / "default") == before


def test_apply_json_output(simdir, capsys):
    code, out, _ = run(capsys, "--simulate", "apply", "-f", str(EXAMPLE_LAYOUT), "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["rounds"] and all(not [r for r in rnd["report"]["results"] if not r["ok"]] for rnd in data["rounds"])
    assert len(data["inventory"]["gpus"]) == 4


@pytest.mark.parametrize("entry,field", [
    ({"index": 0, "vgpus": {"T4-3Q": 2}}, "vgpus.T4-3Q"),
    ({"index": 0, "vgpus": {"T4-2Q": 9}}, "vgpus.T4-2Q"),
    ({"pciAddress": "0000:55:00.0"}, "pciAddress"),
    ({"index": 0, "vgpus": {"../../x": 1}}, "vgpus"),
    ({"index": 0, "mode": "sideways"}, "mode"),
])
def test_bad_layout_exits_2_names_the_field_and_changes_nothing(simdir, capsys, tmp_path, entry, field):
    """The wording is the layout errors' own (tests/system/test_bad_input.py); here: the file, the
    entry as written in it and the field, exit 2, nothing changed."""
    run(capsys, "--simulate", "discover")
    before = file_tree(simdir / "default")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [entry]}}))
    code, out, err = run(capsys, "--simulate", "apply", "-f", str(bad))
    assert code == 2 and out == ""
    assert str(bad) in err and "layouts.default[0]" in err and f".{field}" in err, err
    assert file_tree(simdir / "default") == before


def test_missing_layout_file_exits_2(simdir, capsys, tmp_path):
    code, _, err = run(capsys, "--simulate", "apply", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml" in err


def test_unknown_layout_name_exits_2(simdir, capsys):
    code, _, err = run(capsys, "--simulate", "apply", "-f", str(EXAMPLE_LAYOUT), "--layout", "nope")
    assert code == 2 and "no layout named 'nope'" in err


DM_CONFIG = """
version: v1
vgpu-configs:
  T4-8Q:
    - devices: all
      vgpu-devices:
        "T4-8Q": 2
  T4-small:
    - devices: [0]
      vgpu-devices:
        "T4-1Q": 16
    - devices: [1]
      vgpu-devices:
        "T4-2Q": 8
"""


def test_vgpu_device_manager_config_with_config_name(simdir, capsys, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(DM_CONFIG)
    code, out, err = run(capsys, "--simulate", "t4-node", "apply", "-f", str(cfg), "--config-name", "T4-small")
    assert code == 0, err
    sim = open_sim(simdir / "t4-node")
    inv = sim.discover()
    assert [sorted({v.type_name for v in g.vgpus}) for g in inv.gpus] == [["GRID T4-1Q"], ["GRID T4-2Q"], [], []]
    assert [len(g.vgpus) for g in inv.gpus] == [16, 8, 0, 0]
    # switching configs: every GPU gets T4-8Q; the old vGPUs go
    code, out, err = run(capsys, "--simulate", "t4-node", "apply", "-f", str(cfg), "--config-name", "T4-8Q")
    assert code == 0, err
    inv = sim.discover()
    assert [[v.type_name for v in g.vgpus] for g in inv.gpus] == [["GRID T4-8Q"] * 2] * len(inv.gpus)
    defs = sorted(d.uuid for d in persist.load_definitions(sim.env, sim.io)[0])
    assert defs == sorted(v.id for v in inv.all_vgpus())
    # a name that is not in the file
    code, _, err = run(capsys, "--simulate", "t4-node", "apply", "-f", str(cfg), "--config-name", "T4-1Q")
    assert code == 2 and "no config named 'T4-1Q'" in err and "T4-small" in err


def test_reboot_and_restore(simdir, capsys):
    assert run(capsys, "--simulate", "apply", "-f", str(EXAMPLE_LAYOUT))[0] == 0
    sim = open_sim(simdir / "default")
    before = sorted((v.parent, v.id) for v in sim.discover().all_vgpus())
    code, out, _ = run(capsys, "--simulate", "sim", "reboot")
    assert code == 0
    assert sim.discover().all_vgpus() == []
    code, out, _ = run(capsys, "--simulate", "restore")
    assert code == 0
    assert out.strip().splitlines()[-1] == f"{len(before)} devices restored"
    assert sorted((v.parent, v.id) for v in sim.discover().all_vgpus()) == before


def test_sim_presets_and_reset(simdir, capsys):
    code, out, _ = run(capsys, "sim", "presets")
    assert code == 0
    assert [line.split()[0] for line in out.strip().splitlines()] == preset_names()
    assert run(capsys, "--simulate", "apply", "-f", str(EXAMPLE_LAYOUT))[0] == 0
    code, out, _ = run(capsys, "--simulate", "sim", "reset")
    assert code == 0
    assert open_sim(simdir / "default").discover().all_vgpus() == []


def test_unknown_preset_exits_2(simdir, capsys):
    code, _, err = run(capsys, "--simulate", "no-such-host", "discover")
    assert code == 2 and "no-such-host" in err


@pytest.mark.parametrize("argv, command", [
    (["discover"], "discover"),
    (["--simulate", "discover"], "discover"),
    (["--simulate", "a100-node", "plan", "-f", "x.yaml"], "plan"),
    (["--simulate=t4-node", "-v", "apply", "-f", "x.yaml"], "apply"),
    (["--sim-dir", "discover", "--simulate", "render", "vm"], "render"),  # a value that looks like a command
    (["-v", "sim", "apiserver", "--kubeconfig-out", "k"], "sim"),
    (["--simulate", "no-such-host"], None),
    ([], None),
])
def test_the_command_is_found_past_global_options(argv, command):
    """Only the named command's module is loaded, so it must be found wherever the options put it."""
    from vgpuctl.main import _command_of, _fix_simulate

    assert _command_of(_fix_simulate(argv)) == command


def test_mixed_size_plan_apply_discover(simdir, capsys):
    layout_file = str(EXAMPLE_LAYOUT.parent / "mixed-size-layout.yaml")
    code, out, _ = run(capsys, "--simulate", "mixed-node", "plan", "-f", layout_file)
    assert code == 0
    assert "note: GPU 0 (0000:10:00.0): once in mixed-size mode, places L40S-24Q at slot 0, L40S-8Q at slot 24" in " ".join(
        out.split())  # prose wraps at 80 columns
    code, out, _ = run(capsys, "--simulate", "mixed-node", "apply", "-f", layout_file)
    assert code == 0 and "node matches the layout" in out.splitlines()[-1]
    assert "mixed-size mode on" in out
    joined = " ".join(out.split())
    for i in range(4):  # each GPU's placements said once (the plan's preview and the placing round said both)
        assert len(re.findall(rf"note: GPU {i} \([^)]*\): places ", joined)) == 1, out
    assert "once in mixed-size mode" not in out
    # what enabling mixedSize costs, said (L40S-8Q: 6 in equal-size mode, 4 placements in mixed-size mode)
    assert ("note: GPU 0 (0000:10:00.0): mixed-size mode allows at most 4 x L40S-8Q (placements 0/16/24/40), "
            "equal-size mode 6: without mixedSize the GPU takes 6") in joined
    code, out, _ = run(capsys, "--simulate", "mixed-node", "discover")
    lines = out.splitlines()
    assert "GPU 0: mixed-size mode; GPU 1: mixed-size mode; GPU 2: mixed-size mode; GPU 3: mixed-size mode" in " ".join(
        out.split())
    assert "  GPU 0 |[24Q" + "-" * 19 + "][8Q----][4Q][4Q][8Q----]|" in lines  # one mark per 1 GiB slot
    assert "  GPU 1 |[12C-------][6C--][6C--]|" in lines
    # 2 GiB a mark: each 5 GiB vGPU keeps its label (it was drawn [5][])
    assert "  GPU 2 |[40C------------][20C-----][10C][5C][5C]| (~2 GiB per mark)" in lines
    assert all(len(line) <= 80 for line in lines if line.startswith("  GPU "))
    l40s_rows = [line.split() for line in lines if line.startswith("0    0000:10:0") and "L40S-" in line]
    assert sorted(r[-1] for r in l40s_rows) == ["0-23", "24-31", "32-35", "36-39", "40-47"]  # SLOTS column
    code, out, _ = run(capsys, "--simulate", "mixed-node", "discover", "-o", "json")
    gpus = json.loads(out)["gpus"]
    assert [g["mixed_size"] for g in gpus] == [True, True, True, True, None]
    assert gpus[0]["placements"]["slots"] == 48 and gpus[4]["placements"] is None
    assert sorted(v["placement_id"] for v in gpus[0]["vgpus"]) == [0, 24, 32, 36, 40]
    code, out, _ = run(capsys, "--simulate", "mixed-node", "sim", "reboot")
    code, out, _ = run(capsys, "--simulate", "mixed-node", "restore")
    assert code == 0 and out.strip().splitlines()[-1] == "23 devices restored"  # 5 + 3 + 5 + 4 placed, 6 A40-8Q
