"""The CLI as a new admin meets it (issue 16): ``--version``, help and defaults on every option,
no meaningless flags, a plain answer on a host without GPUs, ``capacity`` saying what it shows,
``python -m benchmarks -h``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib

import pytest
import yaml

from dra_bridge.api.nodepaths import NodePaths
from tests.support.dra import DictClaims, claim_object, devices_of, make_driver, make_node
from tests.support.simnodes import EXAMPLE_LAYOUT, REPO
from vgpuctl import main as cli_main
from vgpuctl.cli.options import HOST_VALUED
from vgpuctl.main import COMMANDS, HelpFormatter, build_parser, main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- --version, help


def test_version_is_the_packages(capsys):
    """``--version`` says the installed distribution's version (pyproject.toml reads it from
    ``vgpuctl.__version__``, so a checkout and an install agree)."""
    import importlib.metadata as md

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vgpuctl.__version__"}
    assert capsys.readouterr().out.strip() == f"vgpuctl {md.version('vgpuctl')}" == f"vgpuctl {cli_main.version()}"


def _parsers(p: argparse.ArgumentParser, path: tuple[str, ...]):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                if path or name in COMMANDS:
                    yield from _parsers(sp, path + (name,))


HIDDEN = {("plan", "--dry-run")}  # accepted only to say it is apply's option
#: the host options after a command (vgpuctl -h lists them) and --json, the old spelling of -o json
HIDDEN_EVERYWHERE = {*HOST_VALUED, "--debug", "--json"}


def _all_parsers():
    for command in COMMANDS:
        for path, p in _parsers(build_parser(command), ()):
            if path[:1] in ((), (command,)) and (path or command == "discover"):
                yield path, p


def test_every_option_of_every_command_has_help_and_shows_its_default():
    seen, missing, no_default = set(), [], []
    for path, p in _all_parsers():
        seen.add(path)
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            name = a.option_strings[-1] if a.option_strings else a.dest
            if a.help == argparse.SUPPRESS:
                assert (path[-1] if path else "", name) in HIDDEN or name in HIDDEN_EVERYWHERE, \
                    f"{' '.join(path)} {name} is hidden"
                continue
            if not (a.help or "").strip():
                missing.append(f"vgpuctl {' '.join(path)} {name}")
            elif a.default not in (None, False, "", [], argparse.SUPPRESS):
                if "default" not in HelpFormatter(prog="x")._get_help_string(a):
                    no_default.append(f"vgpuctl {' '.join(path)} {name}")
    assert {(c,) for c in COMMANDS} <= seen
    assert ("sim", "apiserver") in seen  # nested commands are walked too
    assert missing == [], "options without help"
    assert no_default == [], "options whose help does not show their default"


def test_every_help_page_renders(capsys):
    """``-h`` of every command and subcommand (a stray % in a help text would fail here)."""
    for path, _ in _all_parsers():
        with pytest.raises(SystemExit) as exc:
            main([*path, "-h"])
        assert exc.value.code == 0, path
        out = capsys.readouterr().out
        assert out.startswith("usage: vgpuctl"), path
    with pytest.raises(SystemExit):
        main(["apply", "-h"])
    out = capsys.readouterr().out
    assert "(default: vgpu.kubevirt.io)" in out or "(default vgpu.kubevirt.io)" in out
    assert "--show-ids" in out and "-v, --verbose" in out


def test_benchmarks_help_and_bad_arguments():
    def bench(*argv):
        return subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    p = bench("-h")
    assert p.returncode == 0 and p.stdout.startswith("usage: python -m benchmarks") and p.stderr == ""
    assert "node" in p.stdout and "allocator" in p.stdout
    for bad in (["nope"], ["--nope"], ["node", "nope"], ["storm", "--per-gpu", "0"], ["--sim-kernel", "x"]):
        p = bench(*bad)
        assert p.returncode == 2 and "usage:" in p.stderr and p.stdout == "", bad


# --------------------------------------------------------------------------- a host without GPUs


@pytest.fixture
def no_gpu_root(tmp_path):
    root = tmp_path / "sys"
    (root / "bus/pci/devices").mkdir(parents=True)
    return root


def test_discover_without_gpus_says_so(no_gpu_root, tmp_path, capsys):
    hint = (f"no NVIDIA GPU found under {no_gpu_root}/bus/pci/devices; "
            "to try vgpuctl without one, add --simulate")
    code, out, err = run(capsys, "--sys-root", str(no_gpu_root), "discover")
    assert code == 0 and out == hint + "\n" and err == ""
    code, out, err = run(capsys, "--sys-root", str(no_gpu_root), "discover", "-o", "json")
    assert code == 0 and json.loads(out)["gpus"] == []  # machines get the same document
    assert err == f"note: {hint}\n"


@pytest.mark.parametrize("command", ["plan", "apply"])
@pytest.mark.parametrize("layout", ["example", "all"])
def test_plan_and_apply_without_gpus_say_so(no_gpu_root, tmp_path, capsys, command, layout):
    f = EXAMPLE_LAYOUT
    if layout == "all":  # selects nothing on this host: an empty plan, no layout error
        f = tmp_path / "all.yaml"
        f.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True}]}}))
    state = tmp_path / "state"
    code, out, err = run(capsys, "--sys-root", str(no_gpu_root), "--state-root", str(state), command, "-f", str(f),
                         "--kubelet-root", str(tmp_path / "kubelet"))
    assert code == 2 and out == ""
    assert err == (f"error: no NVIDIA GPU found under {no_gpu_root}/bus/pci/devices; "
                   "to try vgpuctl without one, add --simulate\n")
    assert not state.exists()  # nothing written, not even the lock file


# --------------------------------------------------------------------------- capacity


def test_capacity_without_a_cluster_says_it_is_an_example(capsys):
    code, out, err = run(capsys, "capacity", "--empty")
    assert code == 0
    assert " ".join(out.split("\nNode ")[0].split()).startswith(
        "simulated example cluster (the demo's node and made-up workloads), not yours: --kubeconfig reads a cluster")
    code, out, err = run(capsys, "capacity", "--empty", "--json")
    assert code == 0 and json.loads(out)["gpus"]
    assert err.startswith("note: simulated example cluster")


def test_capacity_says_what_a_mixed_size_gpu_has_in_use(capsys):
    """newcomer finding 2: the example cluster's L40S (mixed-size: placement counters ``slots-*``,
    no memory counter) shows in IN USE what its three workloads hold, as ``demo`` [4] does, not "-"."""
    code, out, err = run(capsys, "capacity", "-o", "wide")
    assert code == 0, err
    (l40s,) = [line for line in out.splitlines() if "0000:19:00.0" in line]
    assert "32 GiB of 48 GiB, 3 vGPUs" in l40s, out


def test_capacity_honours_simulate(tmp_path, capsys):
    """``--simulate``: the simulated node's own slices, its prepared claims counted, not the demo's."""
    node = make_node(tmp_path)
    t4 = "0000:10:00.0"
    sim = ["--simulate", "--sim-dir", str(node.root)]
    code, out, err = run(capsys, *sim, "capacity", "--json")
    assert code == 0, err
    free = json.loads(out)
    assert {g["node"] for g in free["gpus"]} == {node.node} and all(not g["holders"] for g in free["gpus"])
    assert f"simulated node {node.node} (default, in {node.root})" in err and "0 prepared claim(s)" in err

    paths = NodePaths(kubelet_root=node.root / "kubelet", cdi_root=tmp_path / "cdi")
    pool = node.build_pool()
    device = devices_of(pool, t4, "vgpu")[0]
    claims = DictClaims()
    ref = claims.add(claim_object("vm1-gpu", [("gpu", device)], node=node.node, namespace="vms"),
                     "6f1c1c2e-0000-4000-8000-00000000c002")
    assert make_driver(node, paths, claims, pool).prepare([ref])[ref.uid].error is None

    code, out, err = run(capsys, *sim, "capacity")
    assert code == 0, err
    source = " ".join(out.split("\nNode ")[0].split())  # the first lines, wrapped at 80 columns
    assert source.startswith(f"simulated node {node.node} (default, in {node.root}), Kubernetes 1.36")
    assert "1 prepared claim(s)" in source
    code, out, _ = run(capsys, *sim, "capacity", "--json")
    held = json.loads(out)
    (gpu,) = [g for g in held["gpus"] if g["gpu"] == t4]
    assert gpu["holders"] == [{"claim": "vms/vm1-gpu", "device": device, "profile": gpu["holders"][0]["profile"]}]
    before = next(g for g in free["gpus"] if g["gpu"] == t4)
    assert sum(p["fits"] for p in gpu["profiles"]) < sum(p["fits"] for p in before["profiles"])


def test_capacity_refuses_two_sources(tmp_path, capsys):
    code, out, err = run(capsys, "--simulate", "--sim-dir", str(tmp_path / "s"), "capacity", "--kubeconfig", "k")
    assert code == 2 and out == ""
    assert "--simulate reads a simulated node, --kubeconfig and --from a cluster; give one" in err
