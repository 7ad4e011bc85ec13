"""Stable GPU numbers for device names, as the NVIDIA driver's minor numbers are.

Device names (``gpu-<n>-vgpu-...``) must never move to another GPU: a claim allocated
against ``gpu-2-passthrough`` has to fail, not pass through a different board, if GPU 2
disappears. Positions in PCI order shift when a GPU leaves the bus, so the bridge keeps
its own numbering in the plugin's data dir: a GPU keeps the number it was first given,
and a number is never handed to another GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from mdev_manager.host.io import HostIO
from mdev_manager.models import Inventory


class StableGpuIds:
    def __init__(self, path: Path, io: HostIO):
        self.path = Path(path)
        self.io = io
        try:
            self.ids: dict[str, int] = {k: int(v) for k, v in json.loads(self.io.read(self.path)).items()}
        except (OSError, ValueError, AttributeError):
            self.ids = {}

    def apply(self, inv: Inventory) -> Inventory:
        """A copy of ``inv`` whose GPU indices are the stable numbers (new GPUs numbered after the rest)."""
        changed = False
        for gpu in sorted(inv.gpus, key=lambda g: g.address):
            if gpu.address not in self.ids:
                self.ids[gpu.address] = max(self.ids.values(), default=-1) + 1
                changed = True
        if changed:
            self.io.write_atomic(self.path, json.dumps(self.ids, indent=2, sort_keys=True))
        out = inv.model_copy(deep=True)
        for gpu in out.gpus:
            gpu.index = self.ids[gpu.address]
        return out
