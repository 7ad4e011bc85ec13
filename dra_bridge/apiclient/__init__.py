"""The API server's client: the one layer of the node agent and the CLI that talks to Kubernetes.

Importing this package keeps ``kubernetes/__init__.py`` from running when nothing imported it yet: that
file imports every helper of the client (dynamic client and its schema validator, websocket streams,
informers, leader election, ``create_from_yaml``: about 80 modules, 3.5 MB and 75 ms of CPU) before any
of them is asked for, and we use ``kubernetes.client`` and ``kubernetes.config`` alone (#37.3). The
package object is registered bare, with the package's own search path, so ``kubernetes.client`` and
every other submodule still import as usual, on first use.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def _bare_kubernetes_package() -> None:
    if "kubernetes" in sys.modules:
        return
    spec = importlib.util.find_spec("kubernetes")
    if spec is None or spec.submodule_search_locations is None:
        return  # not installed: the first ``from kubernetes import client`` says so
    package = types.ModuleType("kubernetes", "the Kubernetes client, its submodules loaded on first use")
    package.__spec__ = spec
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__package__ = "kubernetes"
    sys.modules["kubernetes"] = package


_bare_kubernetes_package()
