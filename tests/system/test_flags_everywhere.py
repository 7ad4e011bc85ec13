"""One flag set, really everywhere (issue 29, item 9). The rules are checked on EVERY command the
argparse definitions hold (``vgpuctl`` and ``kubectl vgpu``, subcommands included), so a new command
that breaks one fails here:

* ``-o/--output`` takes ``json`` and ``yaml``, with ``--json`` as its hidden alias; every command that
  prints a report has it (the few that do not are listed below, each with why);
* ``--kubeconfig`` comes with ``--context``; ``--context nosuch`` is one line naming it, exit 2;
* a command that reads a cluster honours ``$KUBECONFIG`` (kubectl's order) unless listed below;
* ``--server-version 9.99`` is one line, exit 2, no argparse usage;
* ``--simulate`` with a real host's path option (``--state-root``, ``--mdevctl-root``, ...) is
  refused in one line, exit 2, never silently ignored.
"""

from __future__ import annotations

import argparse
import json

import pytest

from dra_bridge.scheduling.capacity import ProfileFit
from dra_bridge.scheduling.gpuview import GpuView, Holder
from vgpuctl.cli.options import REAL_HOST_PATHS
from vgpuctl.commands.kubectl_plugin import render
from vgpuctl.main import COMMANDS, PLUGIN_COMMANDS, PLUGIN_DESCRIPTION, build_parser, main

#: leaf commands without -o, and why: none of them prints a report a script would parse
NO_OUTPUT = {
    ("serve",): "the node agent, a daemon: its logs are JSON already (--plain-logs)",
    ("render",): "its subcommands have -o yaml|json (objects, as kubectl prints them)",
    ("completion",): "prints a shell script",
    ("sim", "mount"): "a FUSE mount in the foreground",
    ("sim", "reset"): "one line: where the host was rebuilt",
    ("sim", "reboot"): "one line",
    ("sim", "unplug"): "one line",
    ("sim", "replug"): "one line",
    ("sim", "health"): "one line",
    ("sim", "apiserver"): "a server in the foreground (it writes a kubeconfig)",
}
#: commands with --kubeconfig that read a cluster only when asked, whatever $KUBECONFIG says, and why
NO_KUBECONFIG_ENV = {
    ("slices",): "a stable surface (README): without --kubeconfig it works from --server-version and "
                 "--feature-gates alone, reading no cluster",
    ("render", "vm"): "validates against a cluster's schema only when asked (--kubeconfig); else offline, "
                      "against --schema or $VGPUCTL_KUBEVIRT_OPENAPI",
}
#: what a command needs before it reads the cluster
VALUES = {("render", "vm"): ["--set", "name=vm1", "--set", "mode=dra", "--set", "gpus.A100-4C=1"]}


def _leaves(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, p
        return
    for a in subs:
        for name, sp in a.choices.items():
            yield from _leaves(sp, path + (name,))


def _every(commands=COMMANDS, **kw):
    seen, out = set(), []
    for path, p in _leaves(build_parser(commands=commands, every=True, **kw)):
        if id(p) not in seen:  # an alias (render virtualmachine) is its kind's own parser
            seen.add(id(p))
            out.append((path, p))
    return out


VGPUCTL = _every()
PLUGIN = _every(PLUGIN_COMMANDS, prog="kubectl vgpu", description=PLUGIN_DESCRIPTION)


def _options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in p._actions for o in a.option_strings}


def _required(p: argparse.ArgumentParser) -> list[str]:
    """Values for the command's required arguments (the rules are checked before they are used)."""
    argv = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if not a.option_strings and a.nargs in (None, 1, "+"):
            argv.append(str(list(a.choices)[0]) if a.choices else "x")
        elif a.option_strings and a.required:
            argv += [a.option_strings[-1], "x"]
    return argv


def run(capsys, argv, *, plugin: bool = False) -> tuple[int, str, str]:
    if plugin:
        code = main(argv, prog="kubectl vgpu", commands=PLUGIN_COMMANDS, description=PLUGIN_DESCRIPTION)
    else:
        code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code: int, out: str, err: str, *words: str) -> None:
    assert code == 2 and out == "" and len(err.splitlines()) == 1, (code, out, err)
    assert err.startswith("error: ") and "usage:" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def test_the_walk_sees_every_command():
    paths = {p for p, _ in VGPUCTL}
    assert {(c,) for c in COMMANDS if c not in ("sim", "render")} <= paths
    assert ("sim", "apiserver") in paths and ("render", "vm") in paths
    assert {p for p, _ in PLUGIN} == {(c,) for c in PLUGIN_COMMANDS}
    assert set(NO_OUTPUT) | set(NO_KUBECONFIG_ENV) <= paths | {("render",)}


@pytest.mark.parametrize("path,p", VGPUCTL + PLUGIN, ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_output_flag(path, p):
    opts = _options(p)
    if path[:1] == ("render",):
        path = ("render",)
    if path in NO_OUTPUT:
        assert "--output" not in opts or path == ("render",), f"{path} has -o now: take it out of NO_OUTPUT"
        return
    assert "-o" in opts and "--output" in opts, f"vgpuctl {' '.join(path)} has no -o/--output"
    assert {"json", "yaml"} <= set(opts["-o"].choices), path
    if path == ("render",):
        return
    alias = opts.get("--json")
    assert alias is not None and alias.help == argparse.SUPPRESS, f"{path}: --json, hidden, is -o json's alias"
    assert alias.dest == opts["-o"].dest and alias.const == "json"
    ns = p.parse_args([*_required(p), "-o", "json"])
    assert ns.output == "json" and p.parse_args([*_required(p), "--json"]).output == "json"


def test_cordon_uncordon_restore_doctor_demo_take_o_json():
    for name in ("cordon", "uncordon", "drain", "restore", "doctor", "demo"):
        ((_, p),) = [(path, p) for path, p in VGPUCTL if path == (name,)]
        assert p.parse_args([*_required(p), "-o", "json"]).output == "json"
        assert "-o" in p.format_help() and "--json" not in p.format_help()  # -o documented, --json hidden


def _kubeconfig(tmp_path, current: str = "ctx") -> str:
    f = tmp_path / "kubeconfig"
    f.write_text("apiVersion: v1\nkind: Config\n"
                 "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
                 "users: [{name: u, user: {token: t}}]\n"
                 "contexts: [{name: ctx, context: {cluster: c, user: u}}]\n"
                 f"current-context: {current}\n")
    return str(f)


#: render reads a cluster for KubeVirt objects only (their schema): its other kinds take --kubeconfig
#: to be called alike, and kubevirt-cr needs node inventories first
CLUSTER = [(path, p) for path, p in VGPUCTL + PLUGIN if "--kubeconfig" in _options(p)
           and (path[0] != "render" or path in VALUES)]


def _argv(path, p):
    extra = ["--node-name", "n"] if "--node-name" in _options(p) else []  # slices: a node name first
    return [*path, *_required(p), *extra, *VALUES.get(path, [])]


def test_every_cluster_command_is_walked():
    assert {path for path, _ in CLUSTER} >= {("capacity",), ("conformance",), ("doctor",), ("gpus",), ("cordon",),
                                             ("drain",), ("uncordon",), ("serve",), ("slices",), ("get",),
                                             ("render", "vm")}


@pytest.mark.parametrize("path,p", CLUSTER, ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_context_nosuch_is_one_line(path, p, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert "--context" in _options(p), f"{path}: --kubeconfig without --context"
    kc = _kubeconfig(tmp_path)
    plugin = (path, p) in PLUGIN
    code, out, err = run(capsys, [*_argv(path, p), "--kubeconfig", kc, "--context", "nosuch"], plugin=plugin)
    one_line(code, out, err, "--context nosuch: no such context", kc, "its contexts: ctx")


@pytest.mark.parametrize("path,p", CLUSTER, ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_kubeconfig_env_is_honoured(path, p, tmp_path, capsys, monkeypatch):
    """``$KUBECONFIG`` naming a kubeconfig whose current-context is missing: a command that reads it
    says so (and so would have read the cluster there), none falls back to a demo or simulated one."""
    kc = _kubeconfig(tmp_path, current="gone")
    monkeypatch.setenv("KUBECONFIG", kc)
    if path in NO_KUBECONFIG_ENV:
        return
    code, out, err = run(capsys, _argv(path, p), plugin=(path, p) in PLUGIN)
    one_line(code, out, err, kc, "current-context gone is not one of its contexts")


WITH_VERSION = [(path, p) for path, p in VGPUCTL if "--server-version" in _options(p)]


def test_server_version_is_walked():
    assert {path for path, _ in WITH_VERSION} >= {("slices",), ("capacity",), ("conformance",), ("demo",), ("serve",)}


@pytest.mark.parametrize("path,p", WITH_VERSION, ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_unknown_server_version_is_one_line(path, p, capsys):
    code, out, err = run(capsys, [*_argv(path, p), "--server-version", "9.99"])
    one_line(code, out, err, "--server-version 9.99", "1.34, 1.35, 1.36, 1.37")


@pytest.mark.parametrize("path,p", VGPUCTL, ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_simulate_refuses_a_real_hosts_paths(path, p, tmp_path, capsys):
    for option in REAL_HOST_PATHS:
        argvs = [["--simulate=default", option, str(tmp_path), *_argv(path, p)]]  # before the command
        if path[0] != "render":  # after it (render's kinds take only their own --simulate there)
            argvs.append([*_argv(path, p), "--simulate=default", option, str(tmp_path)])
        for argv in argvs:
            code, out, err = run(capsys, argv)
            one_line(code, out, err, f"{option} with --simulate", "--sim-dir")


def test_kubectl_vgpu_json_keys_are_camel_case():
    view = GpuView(node="n", index=0, address="0000:10:00.0", product="T4", kinds=["vgpu"], devices=4,
                   cordon="NoSchedule", cordon_how="taint", holders=[Holder(claim="a/b", device="d", profile="T4-8Q")],
                   profiles=[ProfileFit(profile="T4-8Q", kind="vgpu", memory=8 << 30, published=2, free_devices=1,
                                        fits=1)])
    doc = json.loads(render([view], "json"))
    assert doc["kind"] == "GpuList"

    def keys(x):
        if isinstance(x, dict):
            return set(x) | {k for v in x.values() for k in keys(v)}
        if isinstance(x, list):
            return {k for v in x for k in keys(v)}
        return set()

    ks = keys(doc["items"])
    assert "cordonHow" in ks and "freeDevices" in ks
    assert not [k for k in ks if "_" in k], ks


# --------------------------------------------------------------------------- on a cluster


def test_cordon_uncordon_json_and_capacity_from_kubeconfig_env(capsys, monkeypatch):
    from dra_bridge.sim.cluster import SimCluster
    from kubevirt_templates.render import render as render_templates
    from tests.system.test_cordon import agent_running

    monkeypatch.delenv("KUBECONFIG", raising=False)
    with SimCluster(render=render_templates, version="1.37", health=False) as c, agent_running(c):
        kc = str(c.srv.kubeconfig(c.base / "kubeconfig"))
        code, out, err = run(capsys, ["cordon", f"{c.node}/0", "--kubeconfig", kc, "-o", "json"])
        assert code == 0, err
        doc = json.loads(out)
        assert doc["done"] is True and doc["verdict"].startswith("cordoned:")
        (gpu,) = doc["gpus"]
        assert gpu["index"] == 0 and gpu["cordon"] == "NoSchedule" and gpu["cordonHow"] == "taint"
        code, out, err = run(capsys, ["uncordon", f"{c.node}/0", "--kubeconfig", kc, "-o", "yaml"])
        assert code == 0 and "done: true" in out and "cordonHow: null" in out, out + err

        monkeypatch.setenv("KUBECONFIG", kc)  # as kubectl, doctor, gpus and cordon read it
        for argv in (["capacity", "-o", "json"], ["capacity"]):
            code, out, err = run(capsys, argv)
            assert code == 0 and "simulated example cluster" not in out + err, out + err
        code, out, _ = run(capsys, ["capacity", "-o", "json"])
        assert {g["node"] for g in json.loads(out)["gpus"]} == {c.node}


def test_restore_takes_o_json(tmp_path, capsys):
    from tests.support.simnodes import EXAMPLE_LAYOUT

    sim = ["--simulate", "default", "--sim-dir", str(tmp_path / "host")]
    assert run(capsys, [*sim, "apply", "-f", str(EXAMPLE_LAYOUT)])[0] == 0
    assert run(capsys, [*sim, "sim", "reboot"])[0] == 0
    code, out, err = run(capsys, [*sim, "restore", "-o", "json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] is True and doc["restored"] == 18 and doc["rounds"][0]["results"][0]["ok"] is True
    code, out, _ = run(capsys, [*sim, "restore", "-o", "json"])
    assert code == 0 and json.loads(out)["restored"] == 0


def test_the_help_says_where_the_numbering_is_and_what_sends_conformance_to_a_cluster():
    """Issue #36: the GPU numbering moved to the node's state (an earlier release's under the kubelet
    directory is only adopted), and $KUBECONFIG alone sends conformance to a real cluster."""
    for path, p in VGPUCTL:
        opts = _options(p)
        if "--kubelet-root" in opts:
            text = " ".join(opts["--kubelet-root"].help.split())
            assert "checkpoint and GPU numbering in" not in text and "/var/lib/vgpuctl/gpu-ids.json" in text, path
    ((_, conf),) = [(path, p) for path, p in VGPUCTL if path == ("conformance",)]
    text = " ".join(conf.format_help().split())
    assert "unless --kubeconfig or --context is given or $KUBECONFIG is set" in text, text
    assert "creates a namespace" in text
