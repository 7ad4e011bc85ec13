"""``slices`` never prints an empty List silently (issue 29, item 8): stderr says why no device is
published and what layout would publish some."""

from __future__ import annotations

import json

from tests.support.simnodes import EXAMPLE_LAYOUT
from vgpuctl.main import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_slices_after_the_readmes_apply_say_why_they_are_empty(tmp_path, capsys):
    sim = ["--simulate", "default", "--sim-dir", str(tmp_path / "host")]
    assert run(capsys, *sim, "apply", "-f", str(EXAMPLE_LAYOUT))[0] == 0  # the README's own apply
    code, out, err = run(capsys, *sim, "slices", "-o", "json")
    assert code == 0 and json.loads(out)["items"] == []
    (note,) = err.splitlines()
    assert note.startswith("note: no device to publish: no GPU is handed to DRA by layout default of ")
    assert "(4 GPU(s): 1 in passthrough mode, 3 in vgpu mode;" in note
    assert "a layout entry with mode: dra would publish its GPU" in note
    assert "slices -f examples/layout.yaml --layout dra" in note
    # what it suggests does publish
    code, out, err = run(capsys, *sim, "slices", "-o", "json", "-f", str(EXAMPLE_LAYOUT), "--layout", "dra")
    assert code == 0 and any(s["spec"].get("devices") for s in json.loads(out)["items"])
    assert "no device to publish" not in err


def test_slices_with_devices_add_no_note(tmp_path, capsys):
    code, out, err = run(capsys, "--simulate", "default", "--sim-dir", str(tmp_path / "host"), "slices", "-o", "json")
    assert code == 0 and json.loads(out)["items"] and err == ""
