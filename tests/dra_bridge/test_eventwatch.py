"""The agent keeps only an event source that started: one that failed to start is neither used nor
stopped at shutdown (its stop would act on a source that holds nothing), and the agent goes on with
the periodic resync."""

from __future__ import annotations

import pytest

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.agent.hotplug import Deliver
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.sim import SimIO
from tests.support.dra import make_node, short_tmp


class Source:
    """An event source counting its starts and stops; ``fail``: its start raises (no netlink here)."""

    def __init__(self, fail: bool) -> None:
        self.fail, self.started, self.stops = fail, 0, 0

    def start(self, deliver: Deliver) -> None:
        if self.fail:
            raise OSError("netlink: permission denied")
        self.started += 1

    def stop(self) -> None:
        self.stops += 1


@pytest.fixture
def base():
    with short_tmp("ew") as d:
        yield d


@pytest.mark.parametrize("fail", [True, False], ids=["fails-to-start", "starts"])
def test_only_a_started_event_source_is_kept_and_stopped(base, fail):
    node = make_node(base, "default")
    cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=None,
                      resync_seconds=3600, health_poll_seconds=3600, full_resync_seconds=3600)
    source = Source(fail)
    with LocalApiServer(version="1.35") as srv:
        daemon = Daemon(cfg, node.env, SimIO(node.host), srv.api_client(), events=source)
        daemon._watch_events()
        assert daemon.event_source is (None if fail else source)
        daemon._shutdown()
    assert (source.started, source.stops) == ((0, 0) if fail else (1, 1))
