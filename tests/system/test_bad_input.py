"""Bad input ends in one line, exit 2, nothing written (issue #12, point 10).

Every file the tools read goes through :mod:`mdev_manager.yamlfile`; every error ends at the
CLI's edge (:func:`vgpuctl.main.main`). The matrix runs in-process (an exception that
escaped ``main`` would fail the test); the cases that used to end in a traceback also run as a
subprocess, whose stderr is what the admin sees.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mdev_manager.config import ConfigError, load_config
from mdev_manager.yamlfile import YamlFileError, load_yaml, parse_yaml
from tests.support.simnodes import EXAMPLE_LAYOUT, file_tree
from vgpuctl.main import SIGPIPE_EXIT, main

LAYOUT = "version: vgpuctl/v1\nlayouts:\n  default:\n    - index: 0\n      mode: vgpu\n"


def _deep(path: Path) -> None:
    path.write_text("version: vgpuctl/v1\nlayouts: " + "[" * 5000 + "]" * 5000 + "\n")


def _duplicate(path: Path) -> None:
    path.write_text(LAYOUT + "      mode: dra\n")  # line 6 repeats line 5's key


def _integer_name(path: Path) -> None:
    path.write_text("version: vgpuctl/v1\nlayouts:\n  1:\n    - index: 0\n")


def _broken(path: Path) -> None:
    path.write_text("version: vgpuctl/v1\nlayouts: {default: [index: 0\n")


def _binary(path: Path) -> None:
    path.write_bytes(b"version: vgpuctl/v1\n\x89PNG\x00\xff\xfe")


def _directory(path: Path) -> None:
    path.mkdir()


def _too_big(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(5 << 20)  # sparse: costs no disk


def _dm_duplicate(path: Path) -> None:
    path.write_text("version: v1\nvgpu-configs:\n  T4-1Q:\n    - devices: all\n      vgpu-devices: {T4-1Q: 16}\n"
                    "  T4-1Q:\n    - devices: all\n      vgpu-devices: {T4-2Q: 8}\n")


def _dm_integer_name(path: Path) -> None:
    path.write_text("version: v1\nvgpu-configs:\n  1:\n    - devices: all\n      vgpu-devices: {T4-1Q: 16}\n")


# name -> (make the file, what stderr must contain besides the file's name)
CASES = {
    "deep": (_deep, [":2:", "nested more than 100 levels"]),
    "duplicate": (_duplicate, [":6:7:", "duplicate key 'mode'", "line 5"]),
    "integer-name": (_integer_name, [":3:3:", "the key 1 is read as a number", 'quote it: "1"']),
    "broken": (_broken, [":3:1:", "not valid YAML"]),
    "binary": (_binary, [":2:", "not UTF-8"]),
    "directory": (_directory, ["is a directory"]),
    "too-big": (_too_big, ["larger than 4 MiB"]),
    "dm-duplicate": (_dm_duplicate, [":6:3:", "duplicate key 'T4-1Q'", "line 3"]),
    "dm-integer-name": (_dm_integer_name, [":3:3:", 'quote it: "1"']),
}


@pytest.fixture
def simdir(tmp_path, monkeypatch):
    d = tmp_path / "sims"
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(d))
    return d



def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli(*argv: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
        **kw) -> subprocess.CompletedProcess:
    """``vgpuctl ARGV`` as the admin runs it: no kubeconfig around, HOME in ``cwd``."""
    full = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    full.update({"HOME": str(cwd), **(env or {})})
    return subprocess.run([sys.executable, "-m", "vgpuctl.main", *argv], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture
def made_sim(simdir, capsys) -> Path:
    """The default simulated host, made once before the bad command runs."""
    assert run(capsys, "--simulate", "discover")[0] == 0
    return simdir / "default"


# --------------------------------------------------------------------------- the loader


def test_the_loader_keeps_what_yaml_means():
    assert parse_yaml("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  x: 3\n") == {
        "base": {"x": 1, "y": 2}, "use": {"x": 3, "y": 2}}  # a merge key is no duplicate
    assert parse_yaml("") is None
    assert parse_yaml("a: 1\n---\nb: 2\n", all_documents=True) == [{"a": 1}, {"b": 2}]
    assert parse_yaml('{"k": [1, {"n": null}]}', json_first=True) == {"k": [1, {"n": None}]}
    assert parse_yaml("a: " + "[" * 99 + "]" * 99) is not None  # the mapping and 99 lists: the limit, 100
    with pytest.raises(YamlFileError, match="nested more than 100 levels"):
        parse_yaml("a: " + "[" * 100 + "]" * 100)


@pytest.mark.parametrize("text, fragment", [
    ("a: &x [1, *x]\n", "a loop"),
    ("a: &a [1,2,3,4,5,6,7,8,9,0]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcde", "bcdef", strict=False)), "expands to more than"),
    ("a: !!python/object:os.system x\n", "remove the tag"),
    ("a: 1\n---\nb: 2\n", "holds one document"),
    ('a: "x\x01"\n', "U+0001"),
    ("yes: 1\n", "read as a boolean"),
    ("[1]: 2\n", "a key must be a name"),
    ('{"a": 1,\n "a": 2}', "duplicate key 'a' (first at line 1)"),
])
def test_the_loader_refuses_hostile_yaml(text, fragment):
    with pytest.raises(YamlFileError) as e:
        parse_yaml(text, name="x.yaml", json_first=True)
    assert str(e.value).startswith("x.yaml:") and fragment in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_the_loader_says_where_each_key_is():
    lines: dict[tuple, int] = {}
    doc = parse_yaml("base: &b {x: 1}\nlayouts:\n  default:\n    - index: 0\n      vgpus:\n        T4-1Q: 2\n"
                     "    - <<: *b\n      all: true\n", lines=lines)
    assert doc["layouts"]["default"][1] == {"x": 1, "all": True}
    assert lines[("layouts",)] == 2 and lines[("layouts", "default", 0)] == 4
    assert lines[("layouts", "default", 0, "vgpus", "T4-1Q")] == 6 and lines[("layouts", "default", 1, "all")] == 8


def test_yaml_errors_name_the_file_never_unicode_string():
    """PyYAML calls a parsed string "<unicode string>"; every message says the file instead."""
    from mdev_manager.yamlfile import _yaml_error

    for text in ('a: "x\n', "a:\n\t- b", "- a\nb: c", "a: *nope", "&a a: &a b", "%YAML 1.1\n%YAML 1.1\n---\na: 1"):
        with pytest.raises(YamlFileError) as e:
            parse_yaml(text, name="layout.yaml")
        assert str(e.value).startswith("layout.yaml:") and "<unicode string>" not in str(e.value), str(e.value)
    mark = yaml.Mark("<unicode string>", 0, 2, 0, None, None)
    err = _yaml_error("layout.yaml", "", yaml.MarkedYAMLError(context="while parsing", context_mark=mark), "file")
    assert "<unicode string>" not in str(err) and str(err).startswith("layout.yaml:3:1: not valid YAML: while parsing")
    err = _yaml_error("layout.yaml", "", yaml.YAMLError('in "<unicode string>", line 3'), "file")
    assert str(err).startswith("layout.yaml: not valid YAML: in \"layout.yaml\", line 3")


def test_the_loader_bounds_what_it_reads(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"head -c {5 << 20} /dev/zero > {fifo}"])
    try:
        with pytest.raises(YamlFileError, match="larger than 4 MiB"):
            load_yaml(fifo)
    finally:
        writer.kill()
        writer.wait()
    with pytest.raises(YamlFileError, match="is a character device, not a layout file; give a regular file"):
        load_yaml("/dev/zero")
    (tmp_path / "utf16.yaml").write_bytes("a: 1\n".encode("utf-16"))
    assert load_yaml(tmp_path / "utf16.yaml") == {"a": 1}  # the YAML spec's BOM-marked encodings


def test_load_config_names_the_file_and_line(tmp_path):
    path = tmp_path / "layout.yaml"
    _duplicate(path)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == [f"{path}:6:7: duplicate key 'mode' (first at line 5); keep one of them"]


# --------------------------------------------------------------------------- layout files, every command


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", ["apply", "plan"])
def test_bad_layout_file_one_line_exit_2_nothing_written(case, command, made_sim, tmp_path, capsys):
    make, fragments = CASES[case]
    path = tmp_path / f"{case}.yaml"
    make(path)
    before = file_tree(made_sim, with_sim_state=True)
    name = "T4-1Q" if case.startswith("dm-") else "default"
    code, out, err = run(capsys, "--simulate", command, "-f", str(path), "--layout", name)
    assert code == 2 and out == ""
    line = one_line(err)
    assert str(path) in line and all(f in line for f in fragments), line
    assert file_tree(made_sim, with_sim_state=True) == before


def test_dev_zero_is_refused_at_once(made_sim, capsys):
    before = file_tree(made_sim, with_sim_state=True)
    code, _, err = run(capsys, "--simulate", "apply", "-f", "/dev/zero")
    assert code == 2
    assert one_line(err) == "error: /dev/zero: is a character device, not a layout file; give a regular file"
    assert file_tree(made_sim, with_sim_state=True) == before


def test_a_rejected_layout_names_the_file_above_its_problems(made_sim, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"index": 0, "mode": "sideways"}, {"index": 1, "colour": "blue"}]}}))
    code, _, err = run(capsys, "--simulate", "apply", "-f", str(path))
    assert code == 2 and "Traceback" not in err
    head, *problems = err.splitlines()
    assert head == f"error: {path}: the layout was rejected; nothing was changed:"
    assert problems == [f"  - {path}:4: layouts.default[0].mode: 'sideways' is not a mode (allowed: vgpu, passthrough, "
                        "dra, unmanaged)",
                        f"  - {path}:5: layouts.default[1].colour: unknown field (allowed: index, pciAddress, model, "
                        "all, nvidiaOnly, mode, vgpus, passthrough, migMode, deviceFilter, mixedSize)"], err


@pytest.mark.parametrize("case", ["deep", "duplicate", "integer-name", "broken", "directory", "too-big"])
def test_other_readers_of_user_files(case, made_sim, tmp_path, capsys):
    """render -f (values), render --inventory, capacity --from, serve -f: the same one line."""
    make, fragments = CASES[case]
    path = tmp_path / f"{case}.yaml"
    make(path)
    before = file_tree(made_sim, with_sim_state=True)
    readers = [["render", "vm", "-f", str(path)],
               ["render", "kubevirt-cr", "--inventory", str(path)],
               ["--simulate", "serve", "-f", str(path), "--metrics-port", "0"]]
    if case != "too-big":  # objects may be larger: a cluster's slices
        readers.append(["capacity", "--from", str(path)])
    for argv in readers:
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", (argv, err)
        line = one_line(err)
        assert str(path) in line and all(f in line for f in fragments), (argv, line)
    assert file_tree(made_sim, with_sim_state=True) == before


# --------------------------------------------------------------------------- as the admin sees it


def test_subprocess_bad_files_no_traceback(made_sim, tmp_path):
    deep, dup = tmp_path / "deep.yaml", tmp_path / "dup.yaml"
    _deep(deep)
    _duplicate(dup)
    before = file_tree(made_sim, with_sim_state=True)
    env = {"VGPUCTL_SIM_DIR": str(made_sim.parent)}
    for argv in (["--simulate", "apply", "-f", str(deep)],  # was a RecursionError
                 ["--simulate", "plan", "-f", "/dev/zero"],  # was a read without end
                 ["capacity", "--from", str(deep)],
                 ["render", "vm", "-f", str(dup)]):
        p = cli(*argv, cwd=tmp_path, env=env, timeout=60)
        assert p.returncode == 2 and p.stdout == "", (argv, p.stderr)
        assert str(argv[-1]) in one_line(p.stderr)
    assert file_tree(made_sim, with_sim_state=True) == before


def test_stdout_closed_early_ends_quietly(made_sim, tmp_path):
    """``vgpuctl discover | head -1``: the reader went away; exit as a tool SIGPIPE ended (141)."""
    env = {**os.environ, "VGPUCTL_SIM_DIR": str(made_sim.parent)}
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write
    try:
        p = subprocess.run([sys.executable, "-m", "vgpuctl.main", "--simulate", "discover", "--types"],
                           stdout=w, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    finally:
        os.close(w)
    assert p.returncode == SIGPIPE_EXIT
    assert p.stderr == ""


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_kubeconfig_missing_invalid_unreachable(tmp_path):
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nclusters: [\n")
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    down = _kubeconfig(tmp_path / "down", f"https://127.0.0.1:{_refused_port()}")
    cases = [
        (["capacity", "--kubeconfig", "missing"], ["kubeconfig missing: No such file or directory"]),
        (["capacity", "--kubeconfig"], ["no kubeconfig", ".kube/config", "--kubeconfig FILE"]),
        (["capacity", "--kubeconfig", str(broken)], [f"{broken}:3:1: not valid YAML"]),
        (["capacity", "--kubeconfig", str(empty)], [str(empty), "current-context", "kubectl config view"]),
        (["capacity", "--kubeconfig", str(down)], ["does not answer (Connection refused)", "server address"]),
        (["--simulate", "serve", "--kubeconfig", "missing", "--metrics-port", "0"], ["kubeconfig missing"]),
        (["--simulate", "serve", "--kubeconfig", str(down), "--metrics-port", "0"], ["does not answer"]),
        (["conformance", "--kubeconfig", "missing"], ["kubeconfig missing"]),
    ]
    sims = tmp_path / "sims"
    for argv, fragments in cases:
        p = cli(*argv, cwd=tmp_path, env={"VGPUCTL_SIM_DIR": str(sims)}, timeout=90)
        assert p.returncode == 2, (argv, p.stderr)
        line = one_line(p.stderr)
        assert all(f in line for f in fragments), (argv, line)
    assert not (tmp_path / "vgpuctl-conformance.xml").exists()  # conformance wrote no report
    assert not sims.exists()  # serve touched no (simulated) host


# --------------------------------------------------------------------------- the host


class FailingIO:
    """A host whose every read fails, as a dead FUSE mount or a failing disk does."""

    def __init__(self, err: int):
        self.err = err

    def __getattr__(self, name):
        def fail(path=None, *args, **kw):
            raise OSError(self.err, os.strerror(self.err), str(path))
        return fail


@pytest.mark.parametrize("err, fix", [(errno.ENOTCONN, "mount it again"), (errno.EIO, "dmesg")])
@pytest.mark.parametrize("command", [["discover"], ["apply", "-f", str(EXAMPLE_LAYOUT)], ["restore"]])
def test_a_host_whose_reads_fail(err, fix, command, sim, monkeypatch, capsys):
    from vgpuctl.cli import host
    from vgpuctl.cli.host import Host

    monkeypatch.setattr(host, "open_host", lambda args: Host(env=sim.env, io=FailingIO(err), node=""))
    code, out, err_text = run(capsys, *command)
    assert code == 1 and out == ""  # the host failing is no bad input (#23): 1, the path named
    line = one_line(err_text)
    assert f"cannot read {sim.env.sys_root}" in line and os.strerror(err) in line and fix in line, line


def test_a_sys_root_that_is_no_sysfs(tmp_path, capsys):
    for root in (tmp_path / "missing", Path("/etc/hostname")):
        code, _, err = run(capsys, "--sys-root", str(root), "discover")
        assert code == 2
        assert one_line(err) == (f"error: --sys-root {root}: no bus/pci/devices under it; give the root of a "
                                 "sysfs tree (default /sys)")


def _fuse_missing() -> str:
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "no usable /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy unusable: {exc}"
    return ""


@pytest.mark.skipif(bool(_fuse_missing()), reason=_fuse_missing() or "FUSE available")
def test_a_dead_fuse_mount_says_what_to_do(sim, tmp_path):
    """The FUSE daemon serving the simulated sysfs is killed: every read fails with ENOTCONN."""
    from mdev_manager.sim.fuse import mounted

    mnt = tmp_path / "mnt"
    try:
        ctx = mounted(sim.host, mnt, max_seconds=2.0)
        ctx.__enter__()
    except RuntimeError as exc:
        pytest.skip(f"cannot mount: {exc}")
    try:
        deadline = time.monotonic() + 30
        while True:  # the watchdog kills the daemon after 2 s
            try:
                os.stat(mnt / "bus")
            except OSError as exc:
                if exc.errno == errno.ENOTCONN:
                    break
            assert time.monotonic() < deadline, "the FUSE daemon was not killed"
            time.sleep(0.1)
        p = cli("--sys-root", str(mnt), "discover", cwd=tmp_path, timeout=60)
        assert p.returncode == 1
        line = one_line(p.stderr)
        assert str(mnt) in line and "Transport endpoint is not connected" in line and "fusermount3 -u" in line
    finally:
        ctx.__exit__(None, None, None)


# --------------------------------------------------------------------------- the unexpected


def test_an_unexpected_error_is_one_line_and_debug_shows_it(simdir, monkeypatch, capsys):
    from mdev_manager import discovery

    def boom(*_a, **_kw):
        raise RuntimeError("the host\nfell over")

    monkeypatch.setattr(discovery, "discover", boom)  # the command imports it when it runs
    code, _, err = run(capsys, "--simulate", "discover")
    assert code == 1  # not bad input
    assert one_line(err) == ("error: RuntimeError: the host; fell over (an unexpected error; "
                             "run with --debug for the traceback)")
    with pytest.raises(RuntimeError):
        main(["--debug", "--simulate", "discover"])


def test_debug_is_a_global_option():
    from vgpuctl.main import _command_of

    assert _command_of(["--debug", "--simulate", "default", "apply", "-f", "x"]) == "apply"


def test_a_bad_host_spec_names_its_line(tmp_path, monkeypatch, capsys):
    """``--simulate HOST.yaml`` reads the host spec with the same loader as layouts."""
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path / "sim"))
    spec = tmp_path / "host.yaml"
    spec.write_text("gpus: [{board: T4}]\ngpus: []\n")
    code, out, err = run(capsys, "--simulate", str(spec), "discover")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"{spec}:2:1:" in err and "duplicate key 'gpus'" in err
    assert not (tmp_path / "sim").exists()  # no simulated host was built from it


@pytest.mark.parametrize("content, words", [
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
    ("{not json", "not a JSON OpenAPI schema"),
])
def test_a_bad_kubevirt_schema_file_is_bad_input(content, words, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(content)
    code, out, err = run(capsys, "render", "vm", "--set", "name=v", "--set", "gpus.T4-2Q=1", "--schema", str(schema))
    assert code == 2 and out == ""  # nothing to pipe into kubectl apply
    assert err.count("\n") == 1 and str(schema) in err and words in err
