"""Fixtures the DRA bridge's driver and checkpoint tests share (a test module may override them)."""

from __future__ import annotations

import pytest

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.dra import make_node


@pytest.fixture
def node(tmp_path):
    """The default simulated host, prepared as the daemon leaves a ``dra`` node (VFs enabled)."""
    return make_node(tmp_path, "default")


@pytest.fixture
def paths(tmp_path):
    """The kubelet plugin's directories (kubelet root, CDI root) under the test's tmp dir."""
    return NodePaths.under(tmp_path / "plugin")


@pytest.fixture
def srv():
    """A local API server of a GA DRA release (resource.k8s.io/v1)."""
    with LocalApiServer(version="1.35") as server:
        yield server
