"""The structure rules of docs/design.md ("Structure"), checked on the code as it is.

The import-linter contracts in pyproject.toml carry most of them; these tests run them and add
what import-linter cannot say: that every module is covered by the contracts, that no module
cycle exists (imports inside functions included), that installed code never imports the tests,
and that the node manager's read-only commands load neither grpc nor kubernetes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.imports import graph, imports, sources

REPO = Path(__file__).resolve().parents[1]


def _contracts() -> dict[str, dict]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in cfg["contracts"]}


def _have_import_linter() -> bool:
    try:
        import importlinter.cli  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _have_import_linter(), reason="import-linter is not installed (pip install -e '.[test]')")
def test_import_contracts_are_kept():
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    p = subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout


def test_every_library_module_is_bound_by_the_scaffolding_rules():
    """A new top-level module of a library must be named in the contracts that keep the simulators
    and their dependencies out of it, or they could be imported from it unnoticed."""
    contracts = _contracts()
    scaffolding = set(contracts["sim-is-scaffolding"]["source_modules"])
    sim_deps = set(contracts["sim-deps-in-sim"]["source_modules"])
    top = {p.stem if p.suffix == ".py" else p.name for p in (REPO / "mdev_manager").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    for name in sorted(top - {"sim"}):
        assert f"mdev_manager.{name}" in scaffolding, f"mdev_manager.{name} missing from sim-is-scaffolding"
        assert f"mdev_manager.{name}" in sim_deps, f"mdev_manager.{name} missing from sim-deps-in-sim"
    dra = {p.name for p in (REPO / "dra_bridge").iterdir() if (p / "__init__.py").exists()}
    assert not [p.name for p in (REPO / "dra_bridge").glob("*.py") if p.stem != "__init__"], \
        "dra_bridge holds subpackages only: put a module in the package of its responsibility"
    for name in sorted(dra - {"sim"}):
        assert f"dra_bridge.{name}" in scaffolding, f"dra_bridge.{name} missing from sim-is-scaffolding"
        assert f"dra_bridge.{name}" in sim_deps, f"dra_bridge.{name} missing from sim-deps-in-sim"
    libraries = set(contracts["composition-root"]["source_modules"])
    assert libraries == {"mdev_manager", "dra_bridge", "kubevirt_templates"}


def test_installed_code_never_imports_the_tests():
    bad = [f"{name} imports {m}" for name, path in sources().items() for m in imports(name, path)
           if m == "tests" or m.startswith("tests.")]
    assert bad == []


def test_no_import_cycle_between_modules():
    """Tarjan's strongly connected components over our modules' imports, inside functions too."""
    edges = graph()

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert cycles == []


def _modules_after(call: str, tmp_path: Path) -> set[str]:
    """The modules a fresh interpreter holds once ``call`` (``main([...])`` or ``kubectl_plugin([...])`` of
    vgpuctl.main) has returned 0, or exited 0 as argparse does after ``-h`` and ``--version``."""
    code = ("import json, sys\n"
            "from vgpuctl.main import main, kubectl_plugin\n"
            "try:\n"
            f"    rc = {call}\n"
            "except SystemExit as e:  # argparse's --version and -h\n"
            "    rc = e.code\n"
            "print(json.dumps({'rc': rc, 'modules': sorted(sys.modules)}), file=sys.stderr)\n")
    env = dict(os.environ, VGPUCTL_SIM_DIR=str(tmp_path / "sim"), PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    last = (p.stderr.strip().splitlines() or [""])[-1]
    assert last.startswith("{"), p.stdout[-2000:] + p.stderr[-3000:]
    report = json.loads(last)
    assert report["rc"] == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return set(report["modules"])


@pytest.mark.parametrize("argv", [
    ["--simulate", "discover"],
    ["--simulate", "discover", "-o", "json"],
    ["--simulate", "plan", "-f", str(REPO / "examples" / "layout.yaml")],
])
def test_read_only_node_commands_load_neither_grpc_nor_kubernetes(argv, tmp_path):
    loaded = {m.split(".")[0] for m in _modules_after(f"main({argv!r})", tmp_path)}
    assert "mdev_manager" in loaded  # the command really ran in that process
    assert {"grpc", "kubernetes"} & loaded == set()


#: what ``vgpuctl --version`` and ``-h`` never load (issue #32: under 100 ms of CPU as a whole process,
#: measured by ``python -m benchmarks cli``): the libraries' models, the clients, the terminal, the
#: installed-distribution metadata (its ``email`` parser alone cost more than the rest of --version)
HEAVY_AT_START = {"pydantic", "kubernetes", "grpc", "yaml", "rich", "jinja2", "mdev_manager", "dra_bridge",
                  "kubevirt_templates", "importlib.metadata", "email", "urllib3", "prometheus_client"}


#: the few modules of ours light enough for a command's ``-h`` (names, version rules, paths; no models)
LIGHT_OF_OURS = {"dra_bridge", "dra_bridge.api", "dra_bridge.api.compat", "dra_bridge.api.k8sname",
                 "dra_bridge.api.names", "dra_bridge.api.nodepaths", "dra_bridge.conformance", "mdev_manager",
                 "mdev_manager.names"}


def _every_help() -> list[list[str]]:
    """``-h`` of vgpuctl, of each command and of each subcommand (``sim reset``, ``render vm``, ...), and of
    each ``kubectl vgpu`` command."""
    import argparse

    from vgpuctl.main import COMMANDS, PLUGIN_COMMANDS, build_parser

    argvs = [["--version"], ["-h"]]
    for name in COMMANDS:
        argvs.append([name, "-h"])
        sub = build_parser(name)._subparsers
        command = next(a for a in (sub._group_actions if sub else []) if isinstance(a, argparse._SubParsersAction))
        inner = command.choices[name]._subparsers
        for action in inner._group_actions if inner else []:
            if isinstance(action, argparse._SubParsersAction):
                argvs += [[name, s, "-h"] for s in dict.fromkeys(p.prog.split()[-1] for p in action.choices.values())]
    return argvs + [["plugin", name, "-h"] for name in PLUGIN_COMMANDS]


@pytest.mark.parametrize("argv", _every_help(), ids=" ".join)
def test_version_and_every_help_load_nothing_heavy(argv, tmp_path):
    """#37.3: ``-h`` of every command loads the argument definitions alone, never the command's work."""
    loaded = _modules_after(f"kubectl_plugin({argv[1:]!r})" if argv[0] == "plugin" else f"main({argv!r})", tmp_path)
    heavy = {m for m in loaded - LIGHT_OF_OURS
             if m in HEAVY_AT_START or m.split(".")[0] in HEAVY_AT_START - {"importlib.metadata"}}
    assert heavy == set(), f"vgpuctl {' '.join(argv)} loads {sorted(heavy)}: import them where the command runs"


def test_discover_as_json_loads_no_planner_no_yaml_no_tables(tmp_path):
    """#37.3: ``vgpuctl discover -o json`` on a host (its whole process is benchmarked against ``mdevctl
    types``) reads the node and prints it: the planner, the layout parser, YAML and the text tables load
    only in the commands and outputs that use them."""
    from mdev_manager.sim.node import sim_node

    root = tmp_path / "host"
    sim_node(root, "default")
    argv = ["--sys-root", str(root / "sys"), "--dev-root", str(root / "dev"), "--mdevctl-root", str(root / "etc/mdevctl.d"),
            "--state-root", str(root / "var/lib/vgpuctl"), "discover", "-o", "json"]
    loaded = _modules_after(f"main({argv!r})", tmp_path)
    assert "mdev_manager.discovery" in loaded
    unwanted = {"mdev_manager.plan", "mdev_manager.placeplan", "mdev_manager.config", "mdev_manager.actions",
                "mdev_manager.executor", "mdev_manager.persist", "vgpuctl.output.text", "yaml", "rich",
                "dra_bridge.kubeletplugin.checkpoint"}
    assert unwanted & loaded == set()


def test_apply_without_claims_or_libvirt_loads_neither_their_models_nor_xml(tmp_path):
    """#37: ``vgpuctl apply`` on a node without prepared claims (no kubelet checkpoint) and without libvirt
    domains loads neither the kubelet plugin's checkpoint models nor an XML parser (its whole process is
    benchmarked against 256 mdevctl calls)."""
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"version": "vgpuctl/v1", "layouts": {"default": [
        {"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 2}}]}}))
    code = ("import contextlib, io, json, sys\n"
            "from vgpuctl.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = main(['--simulate', 'apply', '-f', {str(layout)!r}])\n"
            "print(json.dumps({'rc': rc, 'modules': sorted(sys.modules)}), file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO), VGPUCTL_SIM_DIR=str(tmp_path / "sim")))
    report = json.loads(p.stderr.strip().splitlines()[-1])
    assert report["rc"] == 0, p.stderr[-2000:]
    loaded = set(report["modules"])
    assert "mdev_manager.executor" in loaded  # it did apply
    assert {"dra_bridge.kubeletplugin.checkpoint", "dra_bridge.kubeletplugin.state", "xml.etree.ElementTree"} & loaded == set()
