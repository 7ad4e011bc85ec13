"""Terminal output that fits (issue #26, point 6): every command that prints a table prints no line
longer than 80 columns, in a pipe (plain text, no wrapping by rich) and on an 80-column terminal;
``-o wide`` keeps the rest. Commands whose tables are checked in their own tests are named there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.dra import short_tmp
from vgpuctl.main import COMMANDS, build_parser
from vgpuctl.output.tables import allot, fit, short_model, wrap

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE, MIG = "examples/layout.yaml", "examples/mig-layout.yaml"  # run in the checkout: short titles
#: commands whose tables are held to 80 columns in another test
ELSEWHERE = {"demo": "tests/system/test_demo.py::test_demo_text",
             "conformance": "tests/dra_bridge/test_conformance.py::test_junit_and_table",
             "gpus": "tests/system/test_kubectl_plugin.py", "drain": "tests/system/test_cordon.py",
             "cordon": "tests/system/test_cordon.py", "uncordon": "tests/system/test_cordon.py",
             "list": "tests/system/test_list.py"}
#: per simulated preset, the commands run there in order (apply twice: created, then kept)
RUNS = {
    "default": [["discover"], ["discover", "--types"], ["plan", "-f", EXAMPLE], ["apply", "-f", EXAMPLE],
                ["apply", "-f", EXAMPLE], ["discover"], ["list"], ["list", "-d", "-o", "table"], ["capacity"],
                ["sim", "presets"], ["sim", "reboot"], ["restore"]],
    "mig-node": [["plan", "-f", MIG], ["apply", "-f", MIG], ["discover"], ["discover", "--types"], ["capacity"]],
    "mixed-node": [["nvml-probe"]],
}


def _tables() -> set[str]:
    """The commands with a table output (``-o table``), their subcommands included."""
    out = set()
    parser = build_parser(every=True)
    for a in parser._actions:
        for name, sub in (getattr(a, "choices", None) or {}).items() if hasattr(a, "_choices_actions") else ():
            acts = list(sub._actions)
            for b in sub._actions:
                if hasattr(b, "_choices_actions"):
                    acts += [c for s in b.choices.values() for c in s._actions]
            if any("-o" in b.option_strings and "table" in (b.choices or ()) for b in acts):
                out.add(name)
    return out


def test_every_table_command_is_held_to_80_columns():
    covered = {args[0] for runs in RUNS.values() for args in runs} | set(ELSEWHERE) | {"doctor"}
    missing = _tables() - covered
    assert not missing, f"commands printing tables without a width test: {sorted(missing)}"
    assert set(ELSEWHERE) <= set(COMMANDS)


def _run(*argv: str, ok: tuple[int, ...] = (0, 3)) -> str:
    p = subprocess.run([sys.executable, "-m", "vgpuctl", *argv], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode in ok, (argv, p.stdout, p.stderr)
    return p.stdout


@pytest.fixture
def short():
    """A short directory: a path printed whole (never cut) must not be what overflows."""
    with short_tmp("w") as d:
        yield d


@pytest.mark.parametrize("preset", list(RUNS))
def test_tables_of_a_simulated_node_fit_80_columns_in_a_pipe(short, preset):
    tmp_path = short
    for args in RUNS[preset]:
        out = _run("--simulate", preset, "--sim-dir", str(tmp_path / preset), *args)
        long = [line for line in out.splitlines() if len(line) > 80]
        assert not long, f"vgpuctl {' '.join(args)}: {len(long)} lines over 80 columns:\n" + "\n".join(long)
    wide = _run("--simulate", preset, "--sim-dir", str(tmp_path / preset), "discover", "-o", "wide")
    assert any(len(line) > 80 for line in wide.splitlines()) or preset != "default"  # -o wide: as long as it takes


def test_doctor_fits_80_columns(tmp_path):
    with LocalApiServer(version="1.35", feature_gates={}) as srv:
        out = _run("doctor", "--kubeconfig", str(srv.kubeconfig(tmp_path / "kc")), ok=(1,))
    assert out.count("FAIL") >= 1 and all(len(line) <= 80 for line in out.splitlines()), out


@pytest.mark.skipif(shutil.which("script") is None, reason="needs script(1) for a terminal")
def test_on_an_80_column_terminal_nothing_wraps_or_is_cut(tmp_path):
    """rich on a terminal of 80 columns: the same rows, PCI addresses whole, nothing cut with an ellipsis."""
    sim = f"--simulate mig-node --sim-dir {tmp_path / 'sim'}"
    cmd = f"{sys.executable} -m vgpuctl {sim} plan -f {MIG}"
    p = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "LINES": "50", "TERM": "xterm"})
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", p.stdout)
    lines = [line for line in text.splitlines() if line.strip()]
    assert any(line.startswith("GPU  ADDRESS") for line in lines), text
    assert all(len(line) <= 80 for line in lines) and "…" not in text, text
    assert all(a in text for a in ("0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0"))


def test_folding_keeps_fixed_columns_whole_and_list_items_together():
    rows = [["0", "0000:3b:00.0", "whole GPU 1, T4-8Q 2, T4-4Q 4, T4-2Q 8, T4-1Q 16", "default/a-very-long-claim-name"]]
    text = fit(["GPU", "ADDRESS", "FREE", "CLAIM"], rows, fold=("FREE", "CLAIM"), width=50)
    lines = text.splitlines()
    assert all(len(line) <= 50 for line in lines) and "0000:3b:00.0" in lines[1]
    assert all(item in " ".join(lines) for item in ("whole GPU 1,", "T4-8Q 2,", "T4-1Q 16"))
    assert allot(["A", "B"], [["x" * 10, "y"]], fold=("A",), width=80) == [10, 1]  # fits: natural widths
    assert wrap("a, bb, ccc", 6) == ["a, bb,", "ccc"]
    assert [short_model(m) for m in ("AD102GL [L40S]", "GA100 [A100 PCIe 40GB]", "TU104GL [Tesla T4]",
                                     "GH100 [H100 SXM5 80GB]", None)] == ["L40S", "A100 40GB", "T4", "H100 80GB", "?"]
    # the Blackwell boards' long names would wrap the MODEL column (#38): the edition is shortened
    assert [short_model(m) for m in ("GB202GL [RTX PRO 6000 Blackwell Server Edition]",
                                     "GB203 [RTX PRO 4500 Blackwell Server Edition]")] == [
        "RTX PRO 6000", "RTX PRO 4500"]
