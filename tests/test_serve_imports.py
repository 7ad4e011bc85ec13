"""#37.3: the serve path's import set stays within budget.

A subprocess imports what ``vgpuctl serve`` imports before it serves: the command's module, every import of
its ``run`` (read from the source, so a new one is counted) and the API client's ``connect``. A module made
lazy that comes back at the top of a module on that path, or a pile of new ones, fails here. Counts only,
no timings: ``python -m benchmarks`` measures the time and memory (README, "Benchmarks").
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.imports import reachable, sources

REPO = Path(__file__).resolve().parents[1]

#: never loaded before serving: the terminal and templates, the device
#: plugin (``--device-plugin`` loads it), the scheduler model and the other commands' packages, the
#: simulators. (``kubernetes/__init__.py`` itself still imports its dynamic client, streams and informers,
#: about 80 modules and 3.5 MB: keeping the package bare by hand in ``sys.modules`` was tried and left
#: out, a global import side effect for 75 ms.)
NOT_AT_SERVE_START = {
    "rich", "jinja2", "kubevirt_templates", "dra_bridge.deviceplugin", "dra_bridge.rpc.deviceplugin_grpc",
    "dra_bridge.rpc.podresources", "dra_bridge.scheduling", "dra_bridge.conformance", "dra_bridge.doctor",
    "dra_bridge.apiclient.workloads", "dra_bridge.apiclient.clusterfacts", "dra_bridge.sim", "mdev_manager.sim",
}

#: 956 modules on Python 3.11 on 12-07, the kubernetes package's __init__ included (949 when written, budget 990
#: then); headroom for a few small modules, not for another library
MAX_MODULES = 965


def _run_imports() -> list[str]:
    """The import statements inside ``vgpuctl.commands.serve.run``, as source lines."""
    tree = ast.parse((REPO / "vgpuctl" / "commands" / "serve.py").read_text())
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    lines = [ast.unparse(n) for n in ast.walk(run) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert any("dra_bridge.agent.daemon" in line for line in lines), "serve.run no longer imports the agent"
    return lines


def _loaded_before_serving() -> set[str]:
    code = "\n".join(["import json, sys", "import vgpuctl.commands.serve", *_run_imports(),
                      "from dra_bridge.apiclient.client import connect  # vgpuctl.cli.options.connect",
                      "print(json.dumps(sorted(sys.modules)))"])
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0, p.stderr[-3000:]
    return set(json.loads(p.stdout.strip().splitlines()[-1]))


def test_serve_path_loads_nothing_it_does_not_use_and_stays_within_budget():
    loaded = _loaded_before_serving()
    assert {"dra_bridge.agent.daemon", "kubernetes.client", "kubernetes.config"} <= loaded  # the path really ran
    early = sorted(m for m in loaded if m in NOT_AT_SERVE_START or m.rpartition(".")[0] in NOT_AT_SERVE_START
                   or m.split(".")[0] in NOT_AT_SERVE_START)
    assert early == [], f"the serve path loads {early}: import them where they are used"
    assert len(loaded) <= MAX_MODULES, (
        f"the serve path loads {len(loaded)} modules (budget {MAX_MODULES}): a new import at the top of a module "
        "on the path? Import it where it is used, or raise the budget with the reason")


def test_the_agent_never_uses_the_generated_core_v1_or_resource_v1_clients():
    """``kubernetes.client.CoreV1Api``'s module imports every core/v1 model (235 modules, 20 MB in the agent, at its
    first Node read), ``ResourceV1Api``'s every resource/v1 model (71 modules, ~5 MB, at its first publish): the
    agent's calls go through :mod:`dra_bridge.apiclient.core` and :mod:`dra_bridge.apiclient.resource`."""
    generated = re.compile(r"\bclient\.(CoreV1Api|ResourceV1Api)\b|kubernetes\.client\.api\.(core|resource)_v1_api|"
                           r"from kubernetes\.client import [^\n]*\b(CoreV1Api|ResourceV1Api)\b")
    agent = reachable("vgpuctl.commands.serve")
    assert {"dra_bridge.apiclient.nodes", "dra_bridge.apiclient.core", "dra_bridge.apiclient.resource",
            "dra_bridge.apiclient.publisher"} <= agent
    light = {"dra_bridge.apiclient.core", "dra_bridge.apiclient.resource"}
    found = sorted(name for name, path in sources().items()
                   if name in agent - light and generated.search(path.read_text()))
    assert found == [], f"{found} use a generated client: call dra_bridge.apiclient.core.CoreV1Api or .resource"
