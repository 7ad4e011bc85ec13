"""Small untruths (issue 29, item 10), each held to the truth."""

from __future__ import annotations

import yaml

from vgpuctl.main import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _layout(tmp_path, doc: dict, name: str = "l.yaml") -> str:
    f = tmp_path / name
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(f)


def test_an_unknown_size_suggests_its_neighbours_not_a_look_alike(tmp_path, capsys):
    f = _layout(tmp_path, {"version": "vgpuctl/v1", "layouts": {"default": [{"index": 0, "vgpus": {"T4-3Q": 2}}]}})
    code, out, err = run(capsys, "--simulate", "default", "--sim-dir", str(tmp_path / "h"), "plan", "-f", f)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.rstrip().endswith("did you mean 'T4-2Q' or 'T4-4Q'?"), err  # it suggested T4-8Q


def test_an_unknown_type_in_a_vgpu_device_manager_file_is_said_once(tmp_path, capsys):
    f = _layout(tmp_path, {"version": "v1", "vgpu-configs": {"bad": [{"devices": "all",
                                                                     "vgpu-devices": {"T4-3Q": 2}}]}})
    for preset, gpus in (("t4-node", 4), ("default", 4)):
        code, out, err = run(capsys, "--simulate", preset, "--sim-dir", str(tmp_path / preset), "plan", "-f", f,
                             "--config-name", "bad")
        assert code == 2 and out == "", err
        assert err.count("'T4-3Q'") == 1 and len(err.splitlines()) == 1, err  # was once per GPU
        assert f"none of the {gpus} GPUs this entry selects offers vGPU type 'T4-3Q'" in err
        assert "did you mean 'T4-2Q' or 'T4-4Q'?" in err
        assert "L40S-3Q'" not in err  # another board's look-alike is no fix


def test_mixed_size_says_what_it_costs(tmp_path, capsys):
    def layout(n):
        return _layout(tmp_path, {"version": "vgpuctl/v1", "layouts": {"default": [
            {"index": 0, "mixedSize": True, "vgpus": {"L40S-8Q": n}}]}}, f"m{n}.yaml")

    sim = ["--simulate", "mixed-node", "--sim-dir", str(tmp_path / "h")]
    code, out, err = run(capsys, *sim, "plan", "-f", layout(6))  # 6 in equal-size mode
    assert code == 2 and len(err.splitlines()) == 1
    assert err.rstrip().endswith("mixed-size mode allows at most 4 x L40S-8Q (placements 0/16/24/40), equal-size "
                                 "mode 6: without mixedSize the GPU takes 6"), err
    code, out, err = run(capsys, *sim, "plan", "-f", layout(4))
    assert code == 0
    assert "mixed-size mode allows at most 4 x L40S-8Q" in " ".join(out.split())  # said when enabling it


def test_kubectl_vgpu_says_what_a_gpu_offers_not_a_mode_it_is_not_in():
    """Every GPU ``kubectl vgpu`` shows is a ``dra`` GPU: its column says what it offers (it said MODE vgpu)."""
    from dra_bridge.scheduling.gpuview import GpuView
    from vgpuctl.cli.gpus import gpu_table

    views = [GpuView(node="n", index=0, address="0000:10:00.0", product="T4", kinds=["passthrough", "vgpu"])]
    for wide in (False, True):
        header = gpu_table(views, wide=wide).splitlines()[0].split()
        assert "OFFERS" in header and "MODE" not in header
    assert gpu_table(views).splitlines()[1].split()[3] == "whole+vgpu"


def test_drain_evict_says_which_pods_it_evicted(capsys):
    import argparse

    from dra_bridge.scheduling.gpuview import GpuView, Holder
    from vgpuctl.commands.cordon import _drain_report

    held = GpuView(node="n", index=0, address="0000:10:00.0", product="T4", kinds=["vgpu"],
                   holders=[Holder(claim="default/c1", device="d1", profile="T4-8Q", pods=["default/w1"]),
                            Holder(claim="default/c2", device="d2", profile="T4-8Q", pods=["default/w2"])])
    empty = GpuView(node="n", index=0, address="0000:10:00.0", product="T4", kinds=["vgpu"])
    args = argparse.Namespace(output="table", evict=True, timeout=5.0)
    code = _drain_report(args, [held], [empty], {"default/w1": None, "default/w2": "PDB allows 0"}, [], True)
    out = capsys.readouterr().out
    assert code == 0
    assert "evicted pod default/w1 (policy/v1 Eviction)" in out  # it said nothing of the pods it evicted
    assert "eviction of default/w2 refused: PDB allows 0" in out


def _readme_first_command() -> str:
    import re

    from tests.support.simnodes import REPO

    block = re.search(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block is not None
    return block.group(1).splitlines()[0]


def test_the_readmes_first_command_works_as_root_and_as_a_user(tmp_path):
    """It started with ``sudo``, absent as root in a container. Run with stand-ins for id, sudo,
    apt-get and python3: as root nothing calls sudo, as a user apt-get runs under it."""
    import subprocess

    first = _readme_first_command()
    assert not first.startswith("sudo ")
    log = tmp_path / "log"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("sudo", "apt-get", "python3"):
        (bin_ / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n'
                                 + ('exec "$@"\n' if name == "sudo" else "exit 0\n"))
        (bin_ / name).chmod(0o755)
    venv = tmp_path / ".venv/bin"
    venv.mkdir(parents=True)
    for name in ("pip", "vgpuctl"):
        (venv / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
        (venv / name).chmod(0o755)
    for uid, sudo in (("0", False), ("1000", True)):
        log.write_text("")
        (bin_ / "id").write_text(f"#!/bin/sh\necho {uid}\n")
        (bin_ / "id").chmod(0o755)
        p = subprocess.run(["sh", "-c", first], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={"PATH": f"{bin_}:/usr/bin:/bin"})
        assert p.returncode == 0, p.stderr
        calls = log.read_text().splitlines()
        assert ("sudo apt-get install -y python3-venv" in calls) is sudo, calls
        assert "apt-get install -y python3-venv" in calls and calls[-1] == "vgpuctl demo", calls


def test_conformance_says_where_to_look_when_a_workload_times_out():
    """Against a cluster without a scheduler a workload stayed Pending: "not Running after 15s" and no hint."""
    from dra_bridge.conformance.backend import KubeBackend, Run

    class Unscheduled(KubeBackend):
        """A cluster whose pods never change: each read of a workload finds it as it was."""

        def refresh(self, r: Run) -> Run:
            return r

    backend = Unscheduled.__new__(Unscheduled)
    backend.namespace, backend.timeout, backend.poll = "ns", 0.0, 0.0
    r = backend.wait(Run(name="w1", template="t1"))  # never scheduled: no PodScheduled condition
    assert r.phase == "Timeout"
    assert r.reason == ("not Running after 0s; no scheduler placed it or said why (no PodScheduled condition): "
                        "check that kube-scheduler runs, with DynamicResourceAllocation enabled "
                        "(kubectl -n ns describe pod w1)")
    r = backend.wait(Run(name="w2", template="t2", bound_node="node-a"))
    assert "bound to node node-a but not running: check its kubelet and the vgpuctl agent there" in r.reason


def test_the_campaign_without_the_test_extra_says_so_in_one_line():
    import subprocess
    import sys

    from tests.support.simnodes import REPO

    for module, argv in (("tests.campaign.__main__", "['--steps', '1', '--seed', '1']"),
                         ("tests.campaign.mutations", "['--only', 'a']")):  # issue #36: 22 "not caught", exit 1
        code = ("import sys; sys.modules['hypothesis'] = None\n"  # as if not installed
                f"from {module} import main\nsys.exit(main({argv}))")
        p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and p.stdout == "", (module, p.stdout, p.stderr)
        assert p.stderr == ("error: the campaign needs the test extra (hypothesis is not installed): .venv/bin/pip "
                            "install -c .ci/constraints.txt -e '.[test,libvirt]' (or bash .ci/run, which makes "
                            "that .venv)\n"), module


def test_the_campaign_without_libvirt_python_says_so_in_one_line():
    """Its libvirt domains are read through libvirt-python, as the node reads them: without it every
    domain would go unread (issue 36: seed 11 then 'removed' a VF a domain named), so it does not run."""
    import subprocess
    import sys

    from tests.support.simnodes import REPO

    code = ("import sys; sys.modules['libvirt'] = None\n"  # as if not installed
            "from tests.campaign.__main__ import main\nsys.exit(main(['--steps', '1', '--seed', '1']))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.startswith("error: the campaign needs libvirt-python (") and p.stderr.count("\n") == 1
    assert p.stderr.endswith(".venv/bin/pip install -c .ci/constraints.txt -e '.[test,libvirt]' (or bash .ci/run, "
                             "which makes that .venv)\n")


def test_mixed_size_says_what_it_costs_a_dra_gpu_too(tmp_path, capsys):
    from tests.support.simnodes import EXAMPLE_LAYOUT

    mixed = str(EXAMPLE_LAYOUT.parent / "mixed-size-layout.yaml")
    code, out, err = run(capsys, "--simulate", "mixed-node", "--sim-dir", str(tmp_path / "h"), "plan", "-f", mixed,
                         "--layout", "dra")
    assert code == 0, err
    joined = " ".join(out.split())
    assert ("note: GPU 0 (0000:10:00.0): in mixed-size mode (NVIDIA's placements) DRA offers fewer of these sizes "
            "than equal-size mode: ") in joined and "L40S-8Q: 4, not 6" in joined
    assert "GPU 4 (0000:1c:00.0): in mixed-size mode" not in joined  # the A40 stays in equal-size mode


def test_ci_installs_every_test_tool_at_a_pinned_version():
    """A campaign seed means one sequence of steps only with one hypothesis (issue 36): .ci/run installs
    the test and libvirt extras with .ci/constraints.txt, and every package those extras name is pinned
    there exactly, so a tool added to an extra without a pin fails here."""
    import re
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from tests.support.simnodes import REPO

    pins = {canonicalize_name(m[1]): m[2] for m in
            re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", (REPO / ".ci/constraints.txt").read_text(), re.M)}
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {canonicalize_name(Requirement(r).name) for x in ("test", "sim", "libvirt") for r in extras[x]}
    assert named - {"vgpuctl"} <= set(pins), sorted(named - {"vgpuctl"} - set(pins))
    assert "hypothesis" in pins
    assert "-c .ci/constraints.txt -e '.[test,libvirt]'" in (REPO / ".ci/run").read_text()
    assert ".ci/constraints.txt" in (REPO / "README.md").read_text()


# --------------------------------------------------------------------------- issue 36, point 7


def test_one_change_and_one_warning_are_said_in_the_singular(tmp_path, capsys, monkeypatch):
    f = _layout(tmp_path, {"version": "vgpuctl/v1", "layouts": {"default": [{"index": 0, "mode": "passthrough"}]}})
    code, out, _ = run(capsys, "--simulate", "apply", "-f", f)
    assert code == 0 and out.splitlines()[-1] == "1 change; node matches the layout", out

    from dra_bridge.apiclient import clusterfacts
    from dra_bridge.doctor import checks
    from vgpuctl.cli import options

    monkeypatch.setattr(options, "connect", lambda args: None)
    monkeypatch.setattr(clusterfacts, "gather", lambda api, driver: None)
    monkeypatch.setattr(checks, "diagnose", lambda facts: [checks.Finding(status="PASS", check="a", detail="ok"),
                                                           checks.Finding(status="WARN", check="b", detail="hm")])
    code, out, _ = run(capsys, "doctor", "--kubeconfig", str(tmp_path / "unused"))
    assert code == 0 and out.splitlines()[-1] == "1 passed, 1 warning, 0 failed", out


def test_an_entry_selecting_gpus_some_of_which_lack_a_type_says_how_many_do(tmp_path, capsys):
    """``all: true`` with T4-2Q on the default preset selects 4 GPUs, both T4 offer it (was: "none of the 2")."""
    f = _layout(tmp_path, {"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "vgpu",
                                                                             "vgpus": {"T4-2Q": 2}}]}})
    code, out, err = run(capsys, "--simulate", "plan", "-f", f)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "2 of the 4 GPUs this entry selects offer no vGPU type 'T4-2Q' (the other 2 do): GPU 2 (" in err, err
    assert "none of" not in err


def test_sim_health_clear_says_it_cleared_every_queued_xid(capsys):
    gpu = "0000:10:00.0"
    assert run(capsys, "--simulate", "sim", "health", gpu, "xid", "--xid", "48")[1].rstrip().endswith("Xid 48 raised")
    code, out, _ = run(capsys, "--simulate", "sim", "health", gpu, "xid", "--clear")
    assert code == 0 and out.rstrip().endswith(": every queued Xid cleared") and "79" not in out, out


def test_sim_mount_on_a_missing_directory_names_it_and_the_fix(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    code, out, err = run(capsys, "sim", "mount", "default", str(missing))
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: sim mount: the mount point {missing} does not exist; create it first "
                          f"(mkdir -p {missing})"), err
