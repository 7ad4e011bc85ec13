"""Fixtures the DRA bridge's tests share (a test module may override them); ``base`` and ``srv`` are
tests/support/dra.py's, shared with tests/system."""

from __future__ import annotations

import pytest

from dra_bridge.api.nodepaths import NodePaths
from tests.support.dra import base, make_node, srv  # noqa: F401 (fixtures)


@pytest.fixture
def node(tmp_path):
    """The default simulated host, prepared as the daemon leaves a ``dra`` node (VFs enabled)."""
    return make_node(tmp_path, "default")


@pytest.fixture
def paths(tmp_path):
    """The kubelet plugin's directories (kubelet root, CDI root) under the test's tmp dir."""
    return NodePaths.under(tmp_path / "plugin")
