"""``kubectl vgpu`` through real kubectl 1.37 (issue #26, point 1): kubectl finds the ``kubectl-vgpu``
executable pip installs and hands it the arguments after ``vgpu``; the plugin reads ``--kubeconfig``,
``--context``, ``-n`` and ``$KUBECONFIG`` itself, as kubectl passes none of its own on. It shows each
GPU's mode, cordon, holders (claim, pod, VM) and free profiles in 80 columns (``-o wide|json|yaml``),
``--watch`` prints it again at a change, and ``kubectl vgpu <TAB>`` completes through
``kubectl_complete-vgpu``. ``vgpuctl completion bash|zsh`` scripts complete in those shells."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from dra_bridge.sim.cluster import SimCluster
from kubevirt_templates.render import render
from tests.support.deploy import ROOT, kubectl, needs_kubectl
from tests.system.test_cordon import agent_running, t4

ENTRY_POINTS = {"kubectl-vgpu": "kubectl_plugin", "kubectl_complete-vgpu": "kubectl_plugin_complete"}


def test_pip_installs_the_plugin_and_its_completion_as_executables():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {k: v for k, v in scripts.items() if k.startswith("kubectl")} == {
        name: f"vgpuctl.main:{fn}" for name, fn in ENTRY_POINTS.items()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A VM and a pod on GPU 0 (another namespace), what pip would put on PATH, kubectl's HOME."""
    with SimCluster(render=render, version="1.37", health=False, namespace="team-a") as c:
        c.launch(t4("T4-8Q", 1, gpu_index=0), name="pod-a")
        c.namespace = "default"
        c.launch(t4("T4-8Q", 2, gpu_index=0, labels={"vm.kubevirt.io/name": "vm-b"}), name="vm-b")
        bindir = tmp_path_factory.mktemp("bin")
        for name, fn in ENTRY_POINTS.items():  # as pip's console-script wrappers
            (bindir / name).write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                                       f"from vgpuctl.main import {fn}\nsys.exit({fn}())\n")
            (bindir / name).chmod(0o755)
        c.env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "HOME": str(bindir)}
        c.env.pop("KUBECONFIG", None)
        c.kc = c.srv.kubeconfig(c.base / "kubeconfig")
        yield c


def k(c, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([kubectl, *args], capture_output=True, text=True, env={**c.env, **(env or {})}, timeout=120)


@needs_kubectl
def test_kubectl_vgpu_shows_each_gpu_its_holders_and_what_still_fits(cluster):
    c = cluster
    p = k(c, "vgpu", "--kubeconfig", str(c.kc))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), p.stdout
    assert lines[0].split() == ["GPU", "ADDRESS", "MODEL", "OFFERS", "HOLDERS", "FREE"]  # not MODE: all are dra
    gpu0 = next(line for line in lines if line.startswith(f"{c.node}/0 "))
    assert "0000:10:00.0" in gpu0 and " T4 " in gpu0 and "1 VM, 1 pod" in gpu0
    assert "VM default/vm-b" in p.stdout and "pod team-a/w1" in p.stdout
    assert "AD102GL" not in p.stdout and "L40S" in p.stdout  # models as admins name them

    wide = k(c, "vgpu", "-o", "wide", "--kubeconfig", str(c.kc)).stdout
    assert "AD102GL [L40S]" in wide and "gpu-0-vgpu-8gb" in wide
    (doc,) = [json.loads(k(c, "vgpu", "-o", "json", "--kubeconfig", str(c.kc)).stdout)]
    gpu = next(g for g in doc["items"] if g["index"] == 0)
    assert doc["kind"] == "GpuList" and {h["vm"] for h in gpu["holders"]} == {None, "default/vm-b"}
    t4_1 = next(g for g in doc["items"] if g["index"] == 1)
    assert {p["profile"]: p["fits"] for p in t4_1["profiles"]}["T4-8Q"] == 2
    assert yaml.safe_load(k(c, "vgpu", "-o", "yaml", "--kubeconfig", str(c.kc)).stdout) == doc


@needs_kubectl
def test_the_plugin_reads_kubectls_flags_and_environment_itself(cluster):
    c = cluster
    kc = yaml.safe_load(Path(c.kc).read_text())
    kc["clusters"].append({"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}})
    kc["contexts"].append({"name": "elsewhere", "context": {"cluster": "nowhere", "user": kc["users"][0]["name"]}})
    good = kc["current-context"]
    kc["current-context"] = "elsewhere"
    two = c.base / "two-contexts"
    two.write_text(yaml.safe_dump(kc))
    assert k(c, "vgpu", "--kubeconfig", str(two)).returncode != 0  # the current context answers nothing
    assert k(c, "vgpu", "--kubeconfig", str(two), "--context", good).returncode == 0
    assert k(c, "vgpu", "--context", good, env={"KUBECONFIG": str(two)}).returncode == 0
    only = k(c, "vgpu", "get", "-n", "team-a", "--kubeconfig", str(c.kc)).stdout
    assert "pod team-a/w1" in only and "vm-b" not in only
    assert "GPU" in k(c, "vgpu", f"{c.node}/1", "--kubeconfig", str(c.kc)).stdout
    h = k(c, "vgpu", "--help").stdout
    assert h.startswith("usage: kubectl vgpu") and "cordon" in h and "--simulate" not in h


@needs_kubectl
def test_watch_prints_again_when_a_gpu_changes(cluster):
    c = cluster
    p = subprocess.Popen([kubectl, "vgpu", "--watch", "--interval", "0.1", "--watch-count", "2", "--kubeconfig",
                          str(c.kc), f"{c.node}/1"], stdout=subprocess.PIPE, text=True, env=c.env)
    first = p.stdout.readline()
    assert first.split()[0] == "GPU"
    w = c.launch(t4("T4-8Q", 3, gpu_index=1), name="late")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "default/w3" in out.split("\n\n", 1)[1], out
    c.teardown(w)


@needs_kubectl
def test_kubectl_vgpu_cordon_and_completion_through_kubectl(cluster):
    c = cluster
    with agent_running(c):
        p = k(c, "vgpu", "cordon", f"{c.node}/3", "--kubeconfig", str(c.kc))
        assert p.returncode == 0 and "cordoned" in p.stdout, p.stdout + p.stderr
        assert "NoSchedule" in k(c, "vgpu", "--kubeconfig", str(c.kc)).stdout
        assert k(c, "vgpu", "uncordon", f"{c.node}/3", "--kubeconfig", str(c.kc)).returncode == 0
    done = k(c, "__complete", "vgpu", "co")
    assert done.stdout.split() == ["cordon", "completion", ":4"], done.stdout + done.stderr
    assert k(c, "__complete", "vgpu", "drain", "--effect", "").stdout.split() == ["NoSchedule", "NoExecute", ":4"]


def _script(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "vgpuctl", *args], capture_output=True, text=True, check=True,
                          env=env).stdout


@pytest.mark.parametrize("words, want", [
    ("vgpuctl co", "conformance cordon completion"), ("vgpuctl cordon --ef", "--effect"),
    ("vgpuctl drain -o ''", "table wide json yaml"), ("vgpuctl sim re", "reset reboot replug"),
    ("vgpuctl --simulate mig-node apply --show", "--show-ids"), ("vgpuctl completion ''", "bash zsh -h --help")])
def test_the_bash_script_completes_commands_options_and_choices(tmp_path, words, want):
    script = tmp_path / "vgpuctl.bash"
    script.write_text(_script("completion", "bash"))
    run = (f"source {script}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _vgpuctl; "
           'echo "${COMPREPLY[*]}"')
    assert subprocess.run(["bash", "-c", run], capture_output=True, text=True, check=True).stdout.split() == want.split()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_the_zsh_script_offers_the_same(tmp_path):
    script = tmp_path / "_vgpuctl"
    script.write_text(_script("completion", "zsh"))
    stubs = ('compdef() { :; }; _describe() { shift 2; print -r -- "${(P)2}"; }; compadd() { shift; print -r -- "$*"; }; '
             "_files() { print files; }; _message() { print message; }")
    run = f'{stubs}; source {script}; words=(vgpuctl cordon --effect ""); CURRENT=4; _vgpuctl; ' \
          'words=(vgpuctl sim ""); CURRENT=3; _vgpuctl; words=(vgpuctl apply -f ""); CURRENT=4; _vgpuctl'
    out = subprocess.run(["zsh", "-f", "-c", run], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "NoSchedule NoExecute"
    assert "reset:rebuild the simulated host" in out[1] and out[2] == "files"
    assert subprocess.run(["zsh", "-n", str(script)]).returncode == 0


#: what ``kubectl vgpu`` never loads (#37: <= 0.3 s of CPU on one node, ``python -m benchmarks kubectl-vgpu``):
#: the Kubernetes client (its package loads config, dynamic and validation modules, and each typed API its
#: pydantic models), pydantic, the CEL package (it loads its own CLI: typer, prompt_toolkit), rich when not
#: redrawing a terminal, urllib3 (one http.client connection does), grpc, the templates
PLUGIN_NEVER_LOADS = {"kubernetes", "pydantic", "cel", "typer", "prompt_toolkit", "rich", "urllib3", "grpc", "jinja2",
                      "dra_bridge.apiclient.client", "dra_bridge.scheduling.cel", "dra_bridge.pool.model"}


@pytest.mark.parametrize("output", ["", "wide", "json"])
def test_kubectl_vgpu_reads_the_cluster_without_the_kubernetes_client(cluster, output):
    """The plugin against a plain kubeconfig: its holders and free profiles shown, one GET of /version and
    one LIST of each kind it reads (no per-node request), none of the heavy modules loaded."""
    c = cluster
    argv = ["--kubeconfig", str(c.kc)] + (["-o", output] if output else [])
    code = ("import json, sys\n"
            "from dra_bridge.apiclient import reader\n"
            "paths = []\n"
            "get = reader.JsonReader.get\n"
            "def counted(self, path, missing=()):\n"
            "    paths.append(path)\n"
            "    return get(self, path, missing)\n"
            "reader.JsonReader.get = counted\n"
            "from vgpuctl.main import kubectl_plugin\n"
            f"rc = kubectl_plugin({argv!r})\n"
            "print(json.dumps({'rc': rc, 'paths': paths, 'modules': sorted(sys.modules)}), file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**c.env, "PYTHONPATH": str(ROOT)})
    report = json.loads(p.stderr.strip().splitlines()[-1])
    assert report["rc"] == 0, p.stderr[-2000:]
    assert "default/vm-b" in p.stdout and "team-a/w1" in p.stdout  # it really read the cluster
    assert report["paths"] == ["/version", "/apis/resource.k8s.io/v1/resourceslices",
                               "/apis/resource.k8s.io/v1/resourceclaims", "/api/v1/pods",
                               "/apis/kubevirt.io/v1/virtualmachineinstances",
                               "/apis/resource.k8s.io/v1/devicetaintrules", "/api/v1/nodes"]
    heavy = {m for m in report["modules"] if m in PLUGIN_NEVER_LOADS or m.split(".")[0] in PLUGIN_NEVER_LOADS}
    assert heavy == set(), f"kubectl vgpu loads {sorted(heavy)}: import them where they are needed"
