"""What ``vgpuctl plan`` and ``apply`` print (issue 16, output): one screen by default, every step
with ``-v``, type names with ids on request, a progress bar on terminals only.

Where the text matters it is compared with golden files in ``tests/system/golden/``; after a
deliberate change of wording, regenerate them with

    VGPUCTL_UPDATE_GOLDEN=1 python3 -m pytest -q -p no:cacheprovider tests/system/test_output.py

and review the diff. UUIDs, pids, VFIO groups and temporary paths are replaced by placeholders first.
"""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mdev_manager.executor import Report, StepResult
from mdev_manager.models import Blocked
from mdev_manager.plan import make_plan
from mdev_manager.reconcile import Round
from tests.support.simnodes import EXAMPLE_LAYOUT, REPO, SimHolder, layout, open_sim
from vgpuctl.main import main
from vgpuctl.output.summary import LISTED, summary
from vgpuctl.output.terminal import Terminal
from vgpuctl.output.text import TypeNames

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("VGPUCTL_UPDATE_GOLDEN") == "1"
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LAYOUT = str(EXAMPLE_LAYOUT.relative_to(REPO))  # as the README runs it, from the repository


def normalise(text: str, tmp: Path | None = None) -> str:
    text = UUID.sub("<uuid>", text)
    text = re.sub(r"\bpid \d+", "pid <pid>", text)
    text = re.sub(r"/dev/vfio/\d+", "/dev/vfio/<group>", text)
    return text.replace(str(tmp), "<tmp>") if tmp else text


def assert_golden(name: str, text: str, tmp: Path | None = None) -> None:
    path = GOLDEN / name
    text = normalise(text, tmp)
    if UPDATE:
        path.write_text(text)
        return
    assert path.exists(), f"no golden file {path}: run with VGPUCTL_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{name} differs from its golden file (VGPUCTL_UPDATE_GOLDEN=1 rewrites it)"


@pytest.fixture
def simdir(tmp_path, monkeypatch):
    d = tmp_path / "sims"
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(d))
    monkeypatch.chdir(REPO)
    return d


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def layout_file(tmp_path: Path, *entries: dict) -> Path:
    f = tmp_path / f"layout-{len(list(tmp_path.glob('layout-*')))}.yaml"
    f.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": list(entries)}}))
    return f


# --------------------------------------------------------------------------- the default summary


def test_plan_apply_and_apply_again_print_a_summary_per_gpu(simdir, capsys):
    code, out, err = run(capsys, "--simulate", "plan", "-f", LAYOUT)
    assert code == 0, err
    assert_golden("plan_default.txt", out)
    code, out, err = run(capsys, "--simulate", "apply", "-f", LAYOUT)
    assert code == 0, err
    assert_golden("apply_default.txt", out)
    code, out, err = run(capsys, "--simulate", "apply", "-f", LAYOUT)
    assert code == 0, err
    assert_golden("apply_again.txt", out)
    assert out.splitlines()[-1] == "0 changes; node matches the layout"


def test_converging_apply_names_the_blocking_device_and_its_holder(simdir, capsys, tmp_path):
    first = layout_file(tmp_path, {"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 8}})
    assert run(capsys, "--simulate", "t4-node", "apply", "-f", str(first))[0] == 0
    sim = open_sim(simdir / "t4-node")
    held = sorted(sim.discover().gpus[0].vgpus, key=lambda v: v.id)[0]
    holder = SimHolder(sim, [sim.env.vfio_group(held.iommu_group)])
    try:
        other = layout_file(tmp_path, {"index": 0, "mode": "vgpu", "vgpus": {"T4-4Q": 4}})
        code, out, err = run(capsys, "--simulate", "t4-node", "apply", "-f", str(other))
        assert code == 3, (out, err)
        lines = out.splitlines()
        assert lines[-1].startswith("14 changes; converging: 1 device in use keeps")
        (line,) = [ln for ln in lines if ln.strip().startswith(held.id)]
        assert f"pid {holder.pid} (qemu-kvm)" in line
        assert_golden("apply_converging.txt", out, tmp_path)
    finally:
        holder.release()


# --------------------------------------------------------------------------- -v and --show-ids


def test_verbose_lists_every_step_by_type_name_and_ids_on_request(simdir, capsys):
    code, out, _ = run(capsys, "--simulate", "apply", "-f", LAYOUT, "-v")
    assert code == 0
    changes = int(out.splitlines()[-1].split()[0])
    steps = [ln for ln in out.splitlines() if ln.startswith("  [ok] ")]
    assert len(steps) == changes
    assert any("of type T4-2Q on 0000:10:00.0" in s for s in steps)
    assert any(re.search(r"set VF \S+ to vGPU type L40S-8Q$", s) for s in steps)
    assert not re.search(r"nvidia-\d+|type \d+", out), "type ids shown without --show-ids"
    assert out.index("Round 2:") < out.index("Applied: ")  # the steps, then the summary

    run(capsys, "--simulate", "sim", "reset")
    code, out, _ = run(capsys, "--simulate", "plan", "-f", LAYOUT, "--show-ids", "-v")
    assert code == 0
    assert re.search(r"create mdev \S+ of type T4-2Q \(nvidia-\d+\) on", out)
    assert re.search(r"8 x T4-2Q \(nvidia-\d+\)", out)
    assert re.search(r"then 4 x L40S-8Q \(\d+\)", out)


def test_global_verbose_lists_the_steps_too(simdir, capsys):
    code, out, _ = run(capsys, "--simulate", "-v", "plan", "-f", LAYOUT)
    assert code == 0 and out.startswith("Steps:\n  1. ")


# --------------------------------------------------------------------------- one screen, in a pipe


def test_apply_on_the_largest_preset_fits_one_screen(tmp_path):
    """512 vGPUs on 16 GPUs used to print 2,050 lines; the summary is one screen."""
    big = layout_file(tmp_path, {"all": True, "mode": "vgpu", "vgpus": {"L40S-1Q": 32}})
    env = {**os.environ, "VGPUCTL_SIM_DIR": str(tmp_path / "sims")}
    p = subprocess.run([sys.executable, "-m", "vgpuctl.main", "--simulate", "bench-large", "apply",
                        "-f", str(big)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) <= 40, p.stdout
    assert lines[-1] == "1024 changes; node matches the layout"
    assert not ANSI.search(p.stdout) and p.stderr == ""  # a pipe: no colour, no bar
    assert_golden("apply_bench_large.txt", p.stdout, tmp_path)


# --------------------------------------------------------------------------- terminals


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    tty = Terminal(_Tty())
    assert tty.tty
    with tty.progress("applying", 60) as step:
        for _ in range(70):  # a second round grows the total
            step(object())
    drawn = tty.file.getvalue()
    assert "applying" in drawn and "70/70" in ANSI.sub("", drawn)

    pipe = Terminal(io.StringIO())
    assert not pipe.tty
    with pipe.progress("applying", 1000, after=0) as step, pipe.status("reading"):
        for _ in range(1000):
            step(object())
    assert pipe.file.getvalue() == ""


def test_short_work_shows_no_bar():
    tty = Terminal(_Tty())
    with tty.progress("applying", 5, after=60) as step:
        for _ in range(5):
            step(object())
    assert tty.file.getvalue() == ""


def test_apply_in_a_terminal_shows_a_bar_and_colours(tmp_path):
    """As an admin sees it: a pseudo-terminal for stdout; the bar is transient, the summary stays."""
    many = layout_file(tmp_path, {"all": True, "mode": "vgpu", "vgpus": {"T4-1Q": 16}})  # 128 steps
    env = {**os.environ, "VGPUCTL_SIM_DIR": str(tmp_path / "sims"), "TERM": "xterm-256color", "COLUMNS": "160"}
    env.pop("NO_COLOR", None)
    leader, follower = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "vgpuctl.main", "--simulate", "t4-node", "apply",
                          "-f", str(many)], stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE,
                         env=env)
    os.close(follower)
    raw = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        raw += chunk
    os.close(leader)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    p.stderr.close()
    text = raw.decode()
    assert "applying" in text and "/128" in text  # the bar was drawn
    assert "\x1b[" in text  # with colour
    plain = ANSI.sub("", text).replace("\r", "")
    assert "128 changes; node matches the layout" in plain
    assert "16 x T4-1Q" in plain


# --------------------------------------------------------------------------- failures, long lists


def _render(items) -> str:
    term = Terminal(io.StringIO())
    term.print(*items)
    return term.file.getvalue()


def test_failed_steps_and_long_block_lists_stay_on_one_screen(sim):
    """Pure: the summary of an outcome with a failed step and many blocked devices."""
    inv = sim.discover()
    layouts = layout({"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 2}})
    plan = make_plan(inv, layouts)
    *done, last = plan.actions
    report = Report(results=[StepResult(step=a.describe(), device="d", ok=True) for a in done]
                    + [StepResult(step=last.describe(), device="d", ok=False, error="EBUSY",
                                  message="Device or resource busy")])
    t4 = inv.gpus[0].address
    blocked = [Blocked(device=f"dev-{i:02}", gpu=t4, held_by=[f"libvirt domain vm{i} references it"],
                       blocks="its removal") for i in range(LISTED + 5)]
    names = TypeNames([inv])
    text = _render(summary(inv, layouts, [Round(plan=plan, report=report)], blocked, names))
    lines = text.splitlines()
    assert lines[0].split()[-1] == "FAILED" and lines[1].split()[-1] == "1"
    assert "1 x T4-2Q" in lines[1] and f"{LISTED + 5} in use" in lines[1]  # one of two created
    assert "Failed steps:" in lines
    assert any(re.match(r"  create mdev \S+ of type T4-2Q on \S+: EBUSY \(Device or resource busy\)$", ln)
               for ln in lines)
    assert sum(1 for ln in lines if ln.startswith("  dev-")) == LISTED
    assert "  ... and 5 more devices in use (-v lists them all)" in lines
    assert len(lines) < 40
    verbose = _render(summary(inv, layouts, [Round(plan=plan, report=report)], blocked, names, verbose=True))
    assert sum(1 for ln in verbose.splitlines() if ln.startswith("  dev-")) == LISTED + 5
