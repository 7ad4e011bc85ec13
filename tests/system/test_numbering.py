"""One GPU numbering for every command (issue #29, point 1): whichever of ``discover``, ``plan``,
``apply``, ``restore`` or the agent sees a GPU first numbers it, and an ``index:`` names that GPU
for good, so a GPU leaving the bus never moves an entry onto another GPU (which re-laid the A100
out as a passthrough GPU and removed its six vGPUs when ``serve`` had never run)."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mdev_manager import numbering
from mdev_manager.discovery import discover
from mdev_manager.numbering import Numbered, NumberingCorrupt
from mdev_manager.sim.node import sim_node
from vgpuctl.main import main

T4A, T4B, A100, L40S = "0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0"
NVIDIA = "0x10de"
IDX = {"version": "vgpuctl/v1", "layouts": {"default": [
    {"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 8}},
    {"index": 1, "mode": "passthrough"},
]}}


@pytest.fixture
def node(tmp_path, monkeypatch, capsys):
    """A simulated default node no agent ever ran on, and ``run(*argv) -> (exit, json or text)``."""
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path / "sims"))
    n = sim_node(tmp_path / "host", "default")
    argv = ["--simulate", "default", "--sim-dir", str(n.root)]

    def run(*args: str):
        code = main([*argv, *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return n, run


def _file(tmp_path, doc: dict, name: str = "layout.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _vgpus(n, address: str) -> list[str]:
    gpu = discover(n.env, n.io).gpu(address)
    return sorted(v.type_name.split()[-1] for v in gpu.vgpus) if gpu else []


def test_an_index_waits_for_its_gone_gpu_without_the_agent(node, tmp_path):
    """The issue's steps, on a node where ``serve`` never ran."""
    n, run = node
    idx = _file(tmp_path, IDX)
    assert run("apply", "-f", idx)[0] == 0
    assert run("apply", "-f", "examples/layout.yaml", "--gpu", "2")[0] == 0
    before = _vgpus(n, A100)
    assert before == ["A100-4C"] * 6
    assert run("sim", "unplug", T4B)[0] == 0
    code, out, err = run("apply", "-f", idx, "-o", "json")
    assert code == 3, err  # converging: index 1 waits for 0000:13:00.0
    doc = json.loads(out)
    assert [b["device"] for b in doc["blocked"] if b["gone"]] == [T4B]
    assert _vgpus(n, A100) == before  # index 1 did not move onto the A100
    assert discover(n.env, n.io).gpu(A100).driver == "nvidia"
    # the example layout: index 1 waits; the model entry keeps the A100 (no "selected twice")
    code, _out, err = run("apply", "-f", "examples/layout.yaml")
    assert code == 3, err
    assert _vgpus(n, A100) == before
    assert run("sim", "replug", T4B)[0] == 0
    code, _out, err = run("apply", "-f", "examples/layout.yaml")
    assert code == 0, err
    assert discover(n.env, n.io).gpu(T4B).driver == "vfio-pci"


@pytest.mark.parametrize("first", [("discover",), ("plan", "-f", "examples/layout.yaml"),
                                   ("restore",)])
def test_whichever_command_runs_first_numbers_the_gpus(node, tmp_path, first):
    n, run = node
    assert not n.io.exists(n.env.gpu_ids)
    assert run(*first)[0] == 0
    ids = numbering.load(n.env, n.io)
    assert {a: i.number for a, i in ids.items()} == {T4A: 0, T4B: 1, A100: 2, L40S: 3}
    assert run("sim", "unplug", T4A)[0] == 0
    code, out, _err = run("discover", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and {g["address"]: g["index"] for g in doc["gpus"]} == {T4B: 1, A100: 2, L40S: 3}
    assert doc["gone"] == [T4A]


def test_a_new_gpu_is_numbered_after_the_others(node):
    n, run = node
    assert run("sim", "unplug", T4A)[0] == 0
    # `sim unplug` records the numbering first, as the node's agent would have; a GPU this node never
    # saw is one that was off the bus before anything numbered the node
    n.io.remove(n.env.gpu_ids)
    assert run("discover")[0] == 0  # numbers the three GPUs present: 0, 1, 2
    assert run("sim", "replug", T4A)[0] == 0
    code, out, _err = run("discover", "-o", "json")
    assert code == 0
    assert {g["address"]: g["index"] for g in json.loads(out)["gpus"]} == {T4B: 0, A100: 1, L40S: 2, T4A: 3}


def test_an_earlier_releases_numbering_is_adopted(node, tmp_path):
    """``serve`` kept ``{address: n}`` in the DRA driver's data directory: device names must not move."""
    n, run = node
    legacy = n.root / "var/lib/kubelet/plugins/vgpu.kubevirt.io/gpu-ids.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({T4A: 1, T4B: 0, A100: 3, L40S: 2}))
    code, _out, err = run("apply", "-f", _file(tmp_path, IDX), "--kubelet-root", str(n.root / "var/lib/kubelet"))
    assert code == 0, err
    ids = numbering.load(n.env, n.io)
    assert {a: i.number for a, i in ids.items()} == {T4A: 1, T4B: 0, A100: 3, L40S: 2}
    assert _vgpus(n, T4B) == ["T4-2Q"] * 8 and discover(n.env, n.io).gpu(T4A).driver == "vfio-pci"
    assert {a: i.vendor for a, i in ids.items()} == dict.fromkeys((T4A, T4B, A100, L40S), NVIDIA)


def test_an_unreadable_numbering_is_refused_in_one_line(node, tmp_path):
    n, run = node
    assert run("discover")[0] == 0
    n.io.write_atomic(n.env.gpu_ids, "{not json")
    before = [sorted(v.id for v in g.vgpus) for g in discover(n.env, n.io, ids={}).gpus]
    code, out, err = run("apply", "-f", "examples/layout.yaml")
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert str(n.env.gpu_ids) in err and "GPU numbering" in err and "remove it" in err
    assert [sorted(v.id for v in g.vgpus) for g in discover(n.env, n.io, ids={}).gpus] == before


def test_vgpu_device_manager_indices_count_nvidia_gpus_across_a_gone_one(node, tmp_path):
    """vgpu-device-manager's ``devices: [N]`` counts NVIDIA GPUs; a gone one keeps its place."""
    n, run = node
    dm = {"version": "v1", "vgpu-configs": {"t4": [{"devices": [0], "vgpu-devices": {"T4-2Q": 2}},
                                                   {"devices": [1], "vgpu-devices": {"T4-4Q": 1}}]}}
    path = _file(tmp_path, dm, "dm.yaml")
    assert run("apply", "-f", path, "--config-name", "t4")[0] == 0
    assert _vgpus(n, T4B) == ["T4-4Q"]
    assert run("sim", "unplug", T4A)[0] == 0
    code, _out, err = run("apply", "-f", path, "--config-name", "t4")
    assert code == 3, err  # devices [0] waits for 0000:10:00.0
    assert _vgpus(n, T4B) == ["T4-4Q"]  # [1] still names the second T4
    assert _vgpus(n, A100) == []


# ---------------------------------------------------------------- the record itself (pure)
@given(st.lists(st.sets(st.sampled_from([f"0000:{b:02x}:00.0" for b in range(16)])), min_size=1, max_size=8))
def test_a_number_never_moves_and_is_never_reused(seen):
    """Whatever GPUs each run sees, a GPU keeps its first number and no two GPUs share one."""
    ids: dict[str, Numbered] = {}
    first: dict[str, int] = {}
    for present in seen:
        ids = numbering.extend(ids, [(a, NVIDIA) for a in present])
        for a in present:
            first.setdefault(a, ids[a].number)
        assert {a: ids[a].number for a in first} == first
        numbers = [i.number for i in ids.values()]
        assert sorted(numbers) == list(range(len(numbers)))
    assert numbering.parse(numbering.dumps(ids), "x") == ids


@pytest.mark.parametrize("text", ['{"0000:10:00.0": 0, "0000:13:00.0": 0}', "[1]", '{"version": 9, "gpus": {}}',
                                  '{"0000:10:00.0": "x"}', '{"version": 1}'])
def test_a_bad_record_names_the_file_and_the_fix(text):
    with pytest.raises(NumberingCorrupt) as exc:
        numbering.parse(text, "/var/lib/vgpuctl/gpu-ids.json")
    assert str(exc.value).startswith("/var/lib/vgpuctl/gpu-ids.json: ") and "remove it" in str(exc.value)
