"""The in-process transport to a simulated host: reads are file reads, kernel writes go to the model."""

from __future__ import annotations

import os
from pathlib import Path

from mdev_manager.host.io import RealIO
from mdev_manager.sim.kernel import SimHost
from mdev_manager.sim.nvml import SimNvml


class SimIO(RealIO):
    def __init__(self, host: SimHost):
        super().__init__()
        self.host = host
        self._sys = os.path.realpath(host.sys)

    def nvml(self) -> SimNvml:
        return SimNvml(self.host)

    def write(self, path: Path, data: str) -> None:
        real = os.path.realpath(path)
        if real == self._sys or real.startswith(self._sys + os.sep):
            self.host.write(Path(real), data)
        else:
            super().write(path, data)
