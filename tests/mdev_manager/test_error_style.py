"""One error style for every layout format (issue #16): bad layout files fed through the CLI
(``vgpuctl --simulate plan -f FILE``) end in exit 2 and one line on stderr naming the file and
line, the field's path as the file writes it (``layouts.default[0].vgpus.T4-3Q``, never an
internal ``gpus[0]``), what is allowed, and a "did you mean" for a close misspelling. None of
pydantic's wording leaks through, and YAML errors name the file, never ``<unicode string>``.

The whole line is compared with a golden file under ``golden/error_style/`` (the temporary
directory written as ``<dir>``). After changing a message on purpose, regenerate them with::

    VGPUCTL_UPDATE_GOLDEN=1 python3 -m pytest -q -p no:cacheprovider tests/mdev_manager/test_error_style.py

and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vgpuctl.main import main

GOLDEN = Path(__file__).parent / "golden" / "error_style"
UPDATE = os.environ.get("VGPUCTL_UPDATE_GOLDEN") == "1"
PYDANTIC_WORDS = ("Input should be", "Extra inputs are not permitted", "Field required", "errors.pydantic.dev",
                  "pydantic", "Value error", "<unicode string>", "gpus[")

OURS = "version: vgpuctl/v1\nlayouts:\n  default:\n"
DM = "version: v1\nvgpu-configs:\n  t4:\n"


# name -> (file text, --layout, line, path as written (None: no field), did you mean (None: not asked),
#          other fragments); the golden file holds the whole line
CASES = {
    # the file's own fields (schema errors, found when it is read)
    "misspelt-field": (OURS + "    - index: 0\n      mdoe: vgpu\n", "default", 5, "layouts.default[0].mdoe",
                       "mode", ["unknown field", "allowed: index, pciAddress, model, all"]),
    "misspelt-mode": (OURS + "    - index: 0\n      mode: passtrough\n", "default", 5, "layouts.default[0].mode",
                      "passthrough", ["'passtrough' is not a mode", "allowed: vgpu, passthrough, dra, unmanaged"]),
    "misspelt-document-field": ("version: vgpuctl/v1\nlayuots:\n  default:\n    - index: 0\n", "default", 2,
                                "layuots", "layouts", ["allowed: version, layouts"]),
    "misspelt-layout-name": (OURS + "    - index: 0\n", "defualt", 2, "layouts", "default",
                             ["no layout named 'defualt'", "choose one of default"]),
    "index-not-a-number": (OURS + "    - index: zero\n", "default", 4, "layouts.default[0].index", None,
                           ["'zero' is not a whole number"]),
    "count-not-a-number": (OURS + "    - index: 0\n      vgpus:\n        T4-2Q: many\n", "default", 6,
                           "layouts.default[0].vgpus.T4-2Q", None, ["'many' is not a whole number"]),
    "vgpus-not-a-mapping": (OURS + "    - index: 0\n      vgpus: [T4-2Q]\n", "default", 5,
                            "layouts.default[0].vgpus", None, ["expected a mapping (vGPU type -> count"]),
    "entry-not-a-mapping": (OURS + "    - T4-2Q\n", "default", 4, "layouts.default[0]", None,
                            ["'T4-2Q' is not an entry", "index, pciAddress, model or all: true"]),
    "no-selector": (OURS + "    - mode: vgpu\n", "default", 4, "layouts.default[0]", None,
                    ["exactly one of index, pciAddress, model or all: true"]),
    # against the node (found when the layout is planned)
    "type-not-offered": (OURS + "    - index: 0\n      vgpus:\n        T4-3Q: 1\n", "default", 6,
                         "layouts.default[0].vgpus.T4-3Q", None, ["offers no vGPU type 'T4-3Q'", "T4-2Q"]),
    "type-misspelt": (OURS + "    - index: 0\n      mode: vgpu\n      vgpus: {T4-2QQ: 2}\n", "default", 6,
                      "layouts.default[0].vgpus.T4-2QQ", "T4-2Q", ["offers no vGPU type 'T4-2QQ'"]),
    "index-not-on-node": (OURS + "    - index: 0\n    - index: 9\n", "default", 5, None, None,
                          ["layouts.default[1] (index 9).index: the node has 4 GPUs (indices 0-3)"]),
    # vgpu-device-manager's format, by its own names
    "dm-misspelt-field": (DM + "    - devices: all\n      vgpu-device: {T4-1Q: 16}\n", "t4", 5,
                          "vgpu-configs.t4[0].vgpu-device", "vgpu-devices",
                          ["unknown field (allowed: devices, vgpu-devices, device-filter)"]),
    "dm-type-not-offered": (DM + "    - devices: [0]\n      vgpu-devices:\n        T4-3Q: 1\n", "t4", 6,
                            "vgpu-configs.t4[0].vgpu-devices.T4-3Q", None, ["offers no vGPU type 'T4-3Q'"]),
    # YAML itself
    "yaml-syntax": (OURS + "    - index: 0\n    mode: vgpu\n", "default", 5, None, None, ["not valid YAML"]),
}


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory) -> Path:
    """One simulated default node (two T4, an A100, an L40S); ``plan`` changes nothing on it."""
    return tmp_path_factory.mktemp("sim")


def _golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}; run with VGPUCTL_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{name}: stderr differs from {path} (VGPUCTL_UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_layout_is_one_line_naming_file_line_and_path(name, sim_dir, tmp_path, capsys):
    text, layout, line, path, suggestion, fragments = CASES[name]
    f = tmp_path / "layout.yaml"
    f.write_text(text)
    code = main(["--simulate", "--sim-dir", str(sim_dir), "plan", "-f", str(f), "--layout", layout])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", err
    lines = err.splitlines()
    assert len(lines) == 1, err
    got = lines[0]
    assert got.startswith(f"error: {f}:{line}:"), got  # the file and the line
    if path is not None:
        assert f"{f}:{line}: {path}: " in got, got  # the path as the file writes it
    if suggestion is not None:
        assert f"did you mean {suggestion!r}?" in got, got
    for fragment in fragments:
        assert fragment in got, got
    assert not any(w in got for w in PYDANTIC_WORDS), got
    _golden(name, err.replace(str(tmp_path), "<dir>"))


def test_several_problems_each_name_their_line(sim_dir, tmp_path, capsys):
    """Every problem is reported at once, each located; the first line says nothing was changed."""
    f = tmp_path / "layout.yaml"
    f.write_text(OURS + "    - index: zero\n      mode: passtrough\n    - pciAddress: nope\n")
    code = main(["--simulate", "--sim-dir", str(sim_dir), "plan", "-f", str(f)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    head, *problems = err.splitlines()
    assert head == f"error: {f}: the layout was rejected; nothing was changed:"
    assert problems == [
        f"  - {f}:4: layouts.default[0].index: 'zero' is not a whole number",
        f"  - {f}:5: layouts.default[0].mode: 'passtrough' is not a mode (allowed: vgpu, passthrough, dra, "
        "unmanaged); did you mean 'passthrough'?",
        f"  - {f}:6: layouts.default[1].pciAddress: 'nope' is not a PCI address; write it as 0000:65:00.0",
    ]


def test_apply_says_the_same(sim_dir, tmp_path, capsys):
    """``apply`` refuses a layout the node cannot take before writing anything, in the same words."""
    f = tmp_path / "layout.yaml"
    f.write_text(CASES["type-not-offered"][0])
    code = main(["--simulate", "--sim-dir", str(sim_dir), "apply", "-f", str(f)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.replace(str(tmp_path), "<dir>") == (GOLDEN / "type-not-offered.txt").read_text()
