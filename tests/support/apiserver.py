"""pytest fixtures for the local API server; import them into a test module or conftest::

    from tests.support.apiserver import apiserver, resource_api  # noqa: F401

    @pytest.mark.parametrize("apiserver", ["1.34", "1.35"], indirect=True)
    def test_publish(apiserver, resource_api): ...

(Moved here from ``dra_bridge/sim/apiserver/fixtures.py``: installed code imports no pytest.)
"""

from __future__ import annotations

import pytest

from dra_bridge.sim.apiserver import LocalApiServer


@pytest.fixture
def apiserver(request):
    """A started :class:`LocalApiServer`; version from indirect parametrization (default 1.35)."""
    version = getattr(request, "param", "1.35")
    with LocalApiServer(version=version) as server:
        yield server


@pytest.fixture
def resource_api(apiserver):
    """``kubernetes.client.ResourceV1Api`` bound to :func:`apiserver`."""
    from kubernetes import client

    return client.ResourceV1Api(apiserver.api_client())
