"""A simulated host's transport that counts what a read asks the host, for tests that bound a
command's reads (issue #15: a prepare reads only its type; #37: a prepare on the kept state reads
neither type directories nor NVML)."""

from __future__ import annotations

from collections import Counter

from mdev_manager.sim import SimIO


class CountingIO(SimIO):
    """The simulated host's transport, counting type directories read whole (``type_dirs``: one
    ``mdev_supported_types/<id>`` per read), NVML handles taken (``nvml_calls``) and single
    ``available_instances`` reads (``asked``: the parent's address of each) and directories listed
    (``listed``: by path)."""

    def __init__(self, host):
        super().__init__(host)
        self.type_dirs: list[str] = []
        self.nvml_calls = 0
        self.asked: list[str] = []
        self.listed: Counter[str] = Counter()

    def listdir(self, path):
        self.listed[str(path)] += 1
        return super().listdir(path)

    def read_attrs(self, directory, names):
        if directory.parent.name == "mdev_supported_types":
            self.type_dirs.append(directory.name)
        return super().read_attrs(directory, names)

    def read_children(self, directory, names):
        out = super().read_children(directory, names)
        if directory.name == "mdev_supported_types":
            self.type_dirs.extend(out)
        return out

    def read(self, path):
        if path.name == "available_instances":
            self.asked.append(path.parent.parent.parent.name)
        return super().read(path)

    def nvml(self):
        self.nvml_calls += 1
        return super().nvml()
