import json
import logging
import os
import shutil
import subprocess

import pytest
from pydantic import ValidationError

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import RealIO
from mdev_manager.models import MdevDefinition
from mdev_manager.names import NameError_
from mdev_manager.persist import (
    definition_path,
    ensure_layout,
    load_definitions,
    load_vendor_vfio,
    remove_definition,
    save_definition,
    save_vendor_vfio,
)

U1 = "5f3a7f62-1b2c-4d5e-8f90-0a1b2c3d4e5f"
U2 = "6f3a7f62-1b2c-4d5e-8f90-0a1b2c3d4e5f"
U3 = "7f3a7f62-1b2c-4d5e-8f90-0a1b2c3d4e5f"
P1 = "0000:65:00.0"
P2 = "0000:66:00.0"


@pytest.fixture
def env(tmp_path):
    return HostEnv.under(tmp_path)


@pytest.fixture
def io():
    return RealIO()


def _all_files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_round_trip(env, io):
    a = MdevDefinition(uuid=U1, parent=P1, mdev_type="nvidia-222")
    b = MdevDefinition(uuid=U2, parent=P2, mdev_type="i915-GVTg_V5_4", start="manual",
                       attrs=[{"nvidia/vgpu_params": "frl_enable=0"}, {"b": "2"}])
    path = save_definition(env, io, a)
    save_definition(env, io, b)
    assert path == env.mdevctl_root / P1 / U1
    assert json.loads(path.read_text()) == {"mdev_type": "nvidia-222", "start": "auto", "attrs": []}
    assert (env.mdevctl_root / "scripts.d/callouts").is_dir()
    assert (env.mdevctl_root / "scripts.d/notifiers").is_dir()
    defs, problems = load_definitions(env, io)
    assert problems == []
    assert sorted(defs, key=lambda d: d.uuid) == [a, b]
    # replace in place
    save_definition(env, io, a.model_copy(update={"mdev_type": "nvidia-223"}))
    defs, _ = load_definitions(env, io)
    assert {d.uuid: d.mdev_type for d in defs}[U1] == "nvidia-223"
    remove_definition(env, io, P1, U1)
    assert not (env.mdevctl_root / P1).exists()  # empty parent dir dropped
    remove_definition(env, io, P1, U1)  # idempotent
    defs, _ = load_definitions(env, io)
    assert [d.uuid for d in defs] == [U2]


def test_missing_root_is_empty(env, io):
    assert load_definitions(env, io) == ([], [])


def test_malformed_files_reported_not_raised(env, io):
    root = env.mdevctl_root
    ensure_layout(env, io)
    (root / P1).mkdir(parents=True)
    good = {"mdev_type": "nvidia-222", "start": "auto", "attrs": []}
    (root / P1 / U1).write_text(json.dumps(good))
    (root / P1 / U2).write_text("{not json")
    (root / P1 / U3).write_text(json.dumps({"start": "auto"}))
    (root / P1 / "not-a-uuid").write_text(json.dumps(good))
    (root / P1 / ".hidden").write_text("junk")
    (root / P2).mkdir()
    (root / P2 / U1).write_text(json.dumps({**good, "attrs": [{"a": 1}]}))
    (root / P2 / U2).write_text(json.dumps({**good, "attrs": [{"a": "1", "b": "2"}]}))
    (root / P2 / U3).write_text(json.dumps({"mdev_type": "nvidia-222"}))
    (root / "mtty").mkdir()
    (root / "mtty" / U1).write_text(json.dumps(good))
    (root / "65:00.0").mkdir()
    (root / "stray-file").write_text("x")
    (root / ".git").mkdir()

    defs, problems = load_definitions(env, io)
    assert [(d.parent, d.uuid) for d in defs] == [(P1, U1)]
    text = "\n".join(problems)
    assert len(problems) == 8, text
    for fragment in (
        f"{root / P1 / U2}: bad JSON",
        f"{root / P1 / U3}: missing mdev_type",
        f"{root / P1 / 'not-a-uuid'}: ",
        f"{root / P2 / U1}: ",
        f"{root / P2 / U2}: ",
        f"{root / P2 / U3}: missing start",
        f"{root / 'mtty'}: parent",
        f"{root / '65:00.0'}: parent",
    ):
        assert fragment in text, fragment


def test_uppercase_file_name_accepted_and_removable(env, io):
    (env.mdevctl_root / P1).mkdir(parents=True)
    (env.mdevctl_root / P1 / U1.upper()).write_text('{"mdev_type": "nvidia-222", "start": "manual"}')
    defs, problems = load_definitions(env, io)
    assert problems == [] and defs[0].uuid == U1 and defs[0].attrs == []
    remove_definition(env, io, P1, U1)
    assert not (env.mdevctl_root / P1).exists()


@pytest.mark.parametrize(
    "field,value",
    [
        ("parent", "../x"),
        ("parent", "0000:65:00.0/../../x"),
        ("parent", "65:00.0"),  # valid address, but not the name sysfs uses
        ("uuid", "../x"),
        ("uuid", U1 + "/.."),
        ("mdev_type", "../nvidia-222"),
        ("attrs", [{"../remove": "1"}]),
        ("attrs", [{"/sys/x": "1"}]),
        ("attrs", [{"a": "1", "b": "2"}]),
    ],
)
def test_hostile_names_refused(env, io, tmp_path, field, value):
    fields = {"uuid": U1, "parent": P1, "mdev_type": "nvidia-222", field: value}
    with pytest.raises(ValidationError):
        MdevDefinition(**fields)
    before = _all_files(tmp_path)
    if field in ("parent", "uuid"):
        with pytest.raises(NameError_):
            remove_definition(env, io, fields["parent"], fields["uuid"])
        with pytest.raises(NameError_):
            definition_path(env, fields["parent"], fields["uuid"])
    # a model mutated after validation is re-checked before writing
    d = MdevDefinition(uuid=U1, parent=P1, mdev_type="nvidia-222")
    setattr(d, field, value)  # no validate_assignment: only save_definition can catch it
    with pytest.raises((ValidationError, NameError_)):
        save_definition(env, io, d)
    assert _all_files(tmp_path) == before


def test_atomic_write_leaves_no_tmp(env, io, tmp_path):
    d = MdevDefinition(uuid=U1, parent=P1, mdev_type="nvidia-222")
    for t in ("nvidia-222", "nvidia-223", "nvidia-224"):
        save_definition(env, io, d.model_copy(update={"mdev_type": t}))
    save_vendor_vfio(env, io, {"0000:65:00.4": "1145"})
    names = [p.name for p in tmp_path.rglob("*")]
    assert not [n for n in names if n.endswith(".tmp")]


def test_interrupted_write_keeps_old_content(env, io):
    d = MdevDefinition(uuid=U1, parent=P1, mdev_type="nvidia-222")
    path = save_definition(env, io, d)
    # a crash mid-write leaves only the dot-named temp file beside the old one
    (path.parent / f".{U1}.tmp").write_text('{"mdev_type": "nvid')
    defs, problems = load_definitions(env, io)
    assert problems == [] and defs == [d]


def test_vendor_vfio_round_trip(env, io):
    assert load_vendor_vfio(env, io) == {}
    m = {"0000:65:00.5": "1155", "0000:65:00.4": "1145"}
    save_vendor_vfio(env, io, m)
    assert load_vendor_vfio(env, io) == m
    save_vendor_vfio(env, io, {})
    assert load_vendor_vfio(env, io) == {}


@pytest.mark.parametrize("bad", [{"../x": "1145"}, {"0000:65:00.4": "0"}, {"0000:65:00.4": "nvidia-222"}])
def test_vendor_vfio_refuses_bad_entries(env, io, bad):
    with pytest.raises(NameError_):
        save_vendor_vfio(env, io, bad)
    assert not env.vendor_vfio_state.exists()


@pytest.mark.parametrize("content", ["{oops", "[]", '{"vfs": []}', "", '"x"'])
def test_vendor_vfio_corrupt_file(env, io, caplog, content):
    env.vendor_vfio_state.parent.mkdir(parents=True)
    env.vendor_vfio_state.write_text(content)
    with caplog.at_level(logging.WARNING, logger="mdev_manager.persist"):
        assert load_vendor_vfio(env, io) == {}
    assert any("corrupt" in r.getMessage() for r in caplog.records)


def test_vendor_vfio_bad_entries_skipped(env, io, caplog):
    env.vendor_vfio_state.parent.mkdir(parents=True)
    env.vendor_vfio_state.write_text(json.dumps(
        {"version": 1, "vfs": {"0000:65:00.4": "1145", "../x": "1", "0000:65:00.5": 7}}))
    with caplog.at_level(logging.WARNING, logger="mdev_manager.persist"):
        assert load_vendor_vfio(env, io) == {"0000:65:00.4": "1145"}
    assert len([r for r in caplog.records if "skipping" in r.getMessage()]) == 2


def _mdevctl_skip_reason():
    if os.geteuid() != 0:
        return "needs root for unshare -m and bind mounts"
    for tool in ("unshare", "mdevctl"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    return None


@pytest.mark.root
@pytest.mark.unshare
@pytest.mark.skipif(_mdevctl_skip_reason() is not None, reason=_mdevctl_skip_reason() or "")
def test_real_mdevctl_reads_what_we_write(env, io):
    a = MdevDefinition(uuid=U1, parent=P1, mdev_type="nvidia-222")
    b = MdevDefinition(uuid=U2, parent=P2, mdev_type="nvidia-223", start="manual",
                       attrs=[{"nvidia/vgpu_params": "frl_enable=0"}])
    save_definition(env, io, a)
    save_definition(env, io, b)
    # mdevctl 1.2.0 lists definitions without /sys/class/mdev_bus; only the etc dir is bound.
    script = f"mount --bind '{env.mdevctl_root}' /etc/mdevctl.d && mdevctl list --defined --dumpjson"
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "unshare" in r.stderr:
        pytest.skip(f"no private mount namespace here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    got = {
        (parent, uuid): body
        for entry in listed
        for parent, devs in entry.items()
        for dev in devs
        for uuid, body in dev.items()
    }
    assert got == {
        (P1, U1): {"mdev_type": "nvidia-222", "start": "auto", "attrs": []},
        (P2, U2): {"mdev_type": "nvidia-223", "start": "manual",
                   "attrs": [{"nvidia/vgpu_params": "frl_enable=0"}]},
    }


# --------------------------------------------------------------------------- passthrough bindings
def test_passthrough_round_trip_and_bad_content(env, io, caplog):
    from mdev_manager.persist import load_passthrough, save_passthrough

    assert load_passthrough(env, io) == {}
    save_passthrough(env, io, {"0000:13:00.1": "0000:13:00.0", "0000:13:00.0": "0000:13:00.0"})
    path = env.passthrough_state
    assert path.parent == env.state_root
    assert json.loads(path.read_text()) == {"version": 1, "functions": {"0000:13:00.0": "0000:13:00.0",
                                                                         "0000:13:00.1": "0000:13:00.0"}}
    assert load_passthrough(env, io) == {"0000:13:00.0": "0000:13:00.0", "0000:13:00.1": "0000:13:00.0"}
    with pytest.raises(NameError_):
        save_passthrough(env, io, {"../0000:13:00.0": "0000:13:00.0"})
    path.write_text(json.dumps({"version": 1, "functions": {"0000:13:00.0": "0000:13:00.0", "x/../y": "0000:13:00.0",
                                                            "0000:14:00.0": 7}}))
    with caplog.at_level(logging.WARNING):
        assert load_passthrough(env, io) == {"0000:13:00.0": "0000:13:00.0"}
    for bad in ("{nope", "[]", json.dumps({"functions": []})):
        path.write_text(bad)
        assert load_passthrough(env, io) == {}


def test_placements_round_trip_and_bad_content(env, io, caplog):
    from mdev_manager.persist import load_placements, save_placements

    assert load_placements(env, io) == {}
    save_placements(env, io, {P1: {"mixed": True, "vgpus": {U1.upper(): 24, "0000:65:00.4": 0}},
                              P2: {"mixed": False, "vgpus": {}}})
    assert load_placements(env, io) == {P1: {"mixed": True, "vgpus": {"0000:65:00.4": 0, U1: 24}}}  # P2 dropped
    with pytest.raises(ValueError):
        save_placements(env, io, {P1: {"mixed": True, "vgpus": {U1: -1}}})
    data = json.loads(env.placement_state.read_text())
    data["gpus"]["0000:66:00.0"] = {"mixed": "yes"}
    data["gpus"]["0000:67:00.0"] = {"mixed": True, "vgpus": {"../../etc": 3}}
    env.placement_state.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        assert list(load_placements(env, io)) == [P1]  # bad GPUs skipped, logged
    assert "0000:66:00.0" in caplog.text and "0000:67:00.0" in caplog.text
    env.placement_state.write_text("{")
    assert load_placements(env, io) == {}
