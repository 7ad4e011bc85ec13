"""``vgpuctl nvml-probe`` (issue #24, point 7): a read-only recording of what NVML reports, compared
with the catalog (MIG profiles and placements, mixed-size placement tables) and the simulated NVML.

Recordings from real GPUs live in ``tests/fixtures/nvml/*.json`` (``vgpuctl nvml-probe -o json`` on
a machine with an NVIDIA driver); each is checked against the catalog board of its name. None
exists yet: no session so far had a GPU at hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mdev_manager import catalog, catalog_mig, catalog_placements
from mdev_manager.nvmlprobe import READS, ProbeRecord, ReadOnly, probe
from mdev_manager.sim.node import sim_node
from vgpuctl.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"


class Recording:
    """A transport that records every call it is asked for, passing them to the simulated NVML."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def call(*args):
            self.calls.append(name)
            return fn(*args)

        return call


def _board_of(node, bus_id: str) -> str:
    return next(g["board"] for g in node.host.state["gpus"] if g["pf"] == bus_id)


def check_against_catalog(rec: ProbeRecord, board_of) -> None:
    """Every MIG profile and placement, and every mixed-size placement list, is the catalog's."""
    for g in rec.gpus:
        board = board_of(g)
        if board is None:
            continue
        spec = catalog.board(board)
        assert g.memory_mib == spec.framebuffer_mib, g.bus_id
        if catalog_mig.has_mig(board):
            assert g.mig is not None, g.bus_id
            want = {p.name: sorted((pl.start, pl.size) for pl in p.placements) for p in catalog_mig.mig_profiles(board)}
            got = {p["name"]: sorted((pl["start"], pl["size"]) for pl in p["placements"]) for p in g.mig.profiles}
            assert got == want, g.bus_id
        else:
            assert g.mig is None, g.bus_id
        table = catalog_placements.placements(board)
        if table is None:
            assert g.heterogeneous_mode is None, f"{board} has no known table but NVML reports mixed-size mode"
            continue
        placed = [t for t in g.vgpu_types if t.placements]
        assert placed, g.bus_id
        for t in placed:
            assert t.placement_size in table and tuple(t.placements) == tuple(table[t.placement_size]), t.name


@pytest.mark.parametrize("preset", ["mig-node", "mixed-node"])
def test_the_simulated_nvml_agrees_with_the_catalog(tmp_path, preset):
    node = sim_node(tmp_path / "host", preset)
    rec = probe(node.io.nvml())
    assert rec.gpus and not rec.errors
    check_against_catalog(rec, lambda g: _board_of(node, g.bus_id))


def test_the_probe_only_reads(tmp_path):
    node = sim_node(tmp_path / "host", "mixed-node")
    rec = Recording(node.io.nvml())
    before = json.dumps(node.host.state, sort_keys=True)
    probe(rec)
    assert rec.calls and set(rec.calls) <= set(READS)
    assert json.dumps(node.host.state, sort_keys=True) == before  # nothing on the host changed
    for setter in ("set_mig_mode", "set_vgpu_heterogeneous_mode", "create_gpu_instance", "destroy_gpu_instance"):
        with pytest.raises(AttributeError):
            getattr(ReadOnly(node.io.nvml()), setter)


def test_refusals_are_recorded_not_raised(tmp_path):
    """A board without MIG or a placement table answers NOT_SUPPORTED: the record says so per field."""
    node = sim_node(tmp_path / "host", "mixed-node")
    rec = probe(node.io.nvml())
    a40 = next(g for g in rec.gpus if _board_of(node, g.bus_id) == "A40")
    assert a40.mig is None and a40.heterogeneous_mode is None
    assert "mig" in a40.errors and "heterogeneous_mode" in a40.errors


def test_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path))
    assert main(["--simulate", "mixed-node", "nvml-probe", "-o", "json"]) == 0
    rec = ProbeRecord.model_validate(json.loads(capsys.readouterr().out))
    assert {g.name for g in rec.gpus} >= {"NVIDIA L40S", "NVIDIA L4", "NVIDIA H100-80GB"}


def _recordings() -> list[Path]:
    return sorted(FIXTURES.glob("*.json")) if FIXTURES.is_dir() else []


@pytest.mark.skipif(not _recordings(), reason="no recording from a real GPU yet (run `vgpuctl nvml-probe -o json` "
                                              "on a machine with an NVIDIA driver; commit it under tests/fixtures/nvml/)")
@pytest.mark.parametrize("path", _recordings(), ids=lambda p: p.stem)
def test_a_recording_from_real_hardware_agrees_with_the_catalog(path):
    rec = ProbeRecord.model_validate(json.loads(path.read_text()))
    by_name = {b.key.lower(): b.key for b in catalog.BOARDS.values()}

    def board_of(g):  # "NVIDIA H100 80GB HBM3" -> the catalog board whose key its name holds, if any
        name = (g.name or "").lower().replace(" ", "-")
        return next((key for low, key in sorted(by_name.items(), key=lambda kv: -len(kv[0])) if low in name), None)

    check_against_catalog(rec, board_of)
