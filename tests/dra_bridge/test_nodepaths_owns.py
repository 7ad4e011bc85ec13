"""Which files the plugin may remove (``NodePaths.owns``): strictly below its CDI root or metadata
directory, symlinks followed. A claim's files are checked together (``ownership``), the two roots
resolved once for all of them: an unprepare's path checks were a quarter of its CPU in a storm."""

from __future__ import annotations

from pathlib import Path

from dra_bridge.api.nodepaths import NodePaths


def test_ownership_answers_as_owns_and_resolves_each_root_once(tmp_path, monkeypatch):
    paths = NodePaths.under(tmp_path)
    paths.cdi_root.mkdir(parents=True)
    paths.metadata_dir.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (paths.cdi_root / "escape").symlink_to(tmp_path / "elsewhere")
    cases = {
        paths.cdi_root / "vgpu.kubevirt.io-claim_x.json": True,
        paths.metadata_dir / "ns_name" / "req" / "file.json": True,
        paths.cdi_root: False,  # the root itself is never removed
        paths.metadata_dir: False,
        tmp_path / "elsewhere" / "file": False,
        paths.cdi_root / "escape" / "file": False,  # a link out of the root
        paths.cdi_root / ".." / "file": False,
    }
    assert {p: paths.owns(p) for p in cases} == cases

    calls = []
    real = Path.resolve

    def counted(self, strict=False):
        calls.append(self)
        return real(self, strict=strict)

    monkeypatch.setattr(Path, "resolve", counted)
    own = paths.ownership()
    assert {p: own(p) for p in cases} == cases
    assert len(calls) == 2 + len(cases)  # the two roots once, then one resolve per path
