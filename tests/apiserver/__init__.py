"""The local API server moved into the package: :mod:`dra_bridge.sim.apiserver` (``vgpuctl demo`` needs
it after a plain ``pip install``). This module re-exports it, so ``from tests.apiserver import
LocalApiServer`` and ``from tests.apiserver.validation import schema_errors`` keep working."""

import sys as _sys

from dra_bridge.sim.apiserver import *  # noqa: F401,F403
from dra_bridge.sim.apiserver import __all__  # noqa: F401
from dra_bridge.sim.apiserver import dra_rules, errors, patch, resources, selectors, server, validation  # noqa: F401

for _name, _mod in (("dra_rules", dra_rules), ("errors", errors), ("patch", patch), ("resources", resources),
                    ("selectors", selectors), ("server", server), ("validation", validation)):
    _sys.modules[f"{__name__}.{_name}"] = _mod

try:  # pytest fixtures (pytest is a test dependency)
    from dra_bridge.sim.apiserver import fixtures  # noqa: F401

    _sys.modules[f"{__name__}.fixtures"] = fixtures
except ImportError:
    pass
