"""mdev_manager.host.pciids: names from the first readable pci.ids, and nothing of the file kept but
the blocks asked for (the agent runs for months: #37's memory bound)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from mdev_manager.host import pciids


def _ids(path: Path, filler_vendors: int = 0) -> Path:
    filler = "".join(f"{v:04x}  Vendor {v}\n\t0001  Device one of vendor {v} with a long product name\n"
                     for v in range(0x2000, 0x2000 + filler_vendors))
    path.write_text("# pci.ids\n" + filler + "10de  NVIDIA Corporation\n\t26b9  AD102GL [L40S]\n"
                    "\t\t10de 1851  L40S\n\t2330  GH100 [H100 SXM5 80GB]\nffff  Last\n")
    return path


def test_names_come_from_the_first_file_that_can_be_read(tmp_path):
    missing, ids = tmp_path / "missing.ids", _ids(tmp_path / "pci.ids")
    assert pciids.lookup((missing, ids), "0x10DE", "0x26b9") == ("NVIDIA Corporation", "AD102GL [L40S]")
    assert pciids.lookup((missing, ids), "0x10de", "0x9999") == ("NVIDIA Corporation", None)
    assert pciids.lookup((missing, ids), "0x1234", "0x0001") == (None, None)
    assert pciids.lookup((missing,), "0x10de", "0x26b9") == (None, None)


def test_the_files_text_is_not_kept(tmp_path):
    ids = _ids(tmp_path / "big.ids", filler_vendors=12000)  # about 1 MB, as the real file
    assert ids.stat().st_size > 900_000
    tracemalloc.start()
    try:
        assert pciids.lookup((ids,), "0x10de", "0x2330") == ("NVIDIA Corporation", "GH100 [H100 SXM5 80GB]")
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept < 100_000, f"{kept} bytes kept after one lookup in a {ids.stat().st_size}-byte file"
