"""Issue #23 point 10: the DRA plugin serves its sockets again when they are removed behind its back.

The kubelet's plugin watcher finds plugins by their registration sockets in
``<kubelet root>/plugins_registry`` (fsnotify create events, and a walk of the directory when it
starts); a kubelet reinstalled or its state cleaned removes that directory, an admin may remove
one file. The plugin binds the socket again (and the DRA socket if it went too) without a restart,
and the fake kubelet (built from the upstream protos) registers it and prepares a claim through
it. Every wait polls with a deadline.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_bridge.rpc.dra_grpc import KubeletPlugin
from dra_bridge.rpc.sockets import SocketKeeper, socket_identity
from tests.dra_bridge.test_grpc_plugin import DRIVER, ToyDriver
from tests.support.kubelet.fake_kubelet import DraClient, FakeKubelet, short_root

DEADLINE = 10.0


def eventually(pred: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.02)


@pytest.fixture
def root(tmp_path: Path):
    d, cleanup = short_root(tmp_path)
    yield d
    cleanup()


@pytest.fixture
def driver() -> ToyDriver:
    return ToyDriver()


@pytest.fixture
def plugin(root: Path, driver: ToyDriver):
    p = KubeletPlugin(DRIVER, driver, kubelet_root=root, health_poll_interval=0.05)
    p.start()
    yield p
    p.stop(grace=0)


@pytest.fixture
def kubelet(root: Path) -> FakeKubelet:
    return FakeKubelet(root)


def registers_and_prepares(kubelet: FakeKubelet, plugin: KubeletPlugin, uid: str) -> None:
    """What the kubelet does on the socket's create event: register, then prepare through the endpoint."""
    eventually(lambda: kubelet.discover_dra_plugins() == [plugin.registration_socket], "the registration socket")
    registration = kubelet.register_dra_plugin(plugin.registration_socket)
    assert registration.accepted and plugin.wait_registered(5)
    with registration.client("v1") as client:
        got = client.prepare([("default", uid, "vm")])
    assert got[uid]["error"] == "" and got[uid]["devices"][0]["device_name"] == "vgpu-vm"


@pytest.mark.parametrize("removed", [["plugins_registry"], ["plugins_registry", "plugins"]])
def test_removed_directories_made_again_get_their_sockets_back(
    plugin: KubeletPlugin, kubelet: FakeKubelet, root: Path, removed: list[str]
) -> None:
    """The kubelet's registration directory (and its plugins directory: the kubelet's state
    cleaned) removed: nothing is bound in a directory the kubelet has not made again (the plugin
    never makes it, a remover may still be at work); once it is back, the sockets are too."""
    registers_and_prepares(kubelet, plugin, "uid-1")
    for name in removed:
        shutil.rmtree(root / name)
    assert plugin._keeper is not None and plugin._keeper.check_once() == []
    assert not (root / "plugins_registry").exists()
    for name in removed:
        (root / name).mkdir()
    registers_and_prepares(kubelet, plugin, "uid-2")
    assert plugin.dra_socket.is_socket()


def test_a_removed_registration_socket_is_served_again(plugin: KubeletPlugin, kubelet: FakeKubelet) -> None:
    registers_and_prepares(kubelet, plugin, "uid-1")
    dra = socket_identity(plugin.dra_socket)
    plugin.registration_socket.unlink()
    eventually(lambda: plugin.registration_socket.is_socket(), "the registration socket back")
    registers_and_prepares(kubelet, plugin, "uid-2")
    assert socket_identity(plugin.dra_socket) == dra  # the DRA socket was not touched


def test_a_removed_dra_socket_is_served_again_and_registered_anew(
    plugin: KubeletPlugin, kubelet: FakeKubelet, root: Path
) -> None:
    """A new DRA socket comes with a new registration socket: the kubelet registers again and dials
    the new socket. A health stream on the old server ends (the kubelet opens it again)."""
    registers_and_prepares(kubelet, plugin, "uid-1")
    reg = socket_identity(plugin.registration_socket)
    with DraClient(plugin.dra_socket) as client:
        stream = client.watch_health(timeout=30)
        stream.get(timeout=5)
        plugin.dra_socket.unlink()
        assert stream.ended.wait(DEADLINE)
    eventually(lambda: plugin.dra_socket.is_socket() and plugin.registration_socket.is_socket()
               and socket_identity(plugin.registration_socket) != reg, "both sockets served again")
    assert not plugin.registered  # the kubelet has not registered the new socket yet: not claimed
    registers_and_prepares(kubelet, plugin, "uid-2")
    with DraClient(plugin.dra_socket) as client:
        assert client.watch_health(timeout=30).get(timeout=5).devices


def test_the_plugins_own_directory_removed_is_made_again(plugin: KubeletPlugin, kubelet: FakeKubelet) -> None:
    """The remover finishes first (the keeper waits for the directories to settle), then the
    plugin's own directory is made again for its socket. A new DRA socket comes with a new
    registration socket: the kubelet registers on that one (the old one goes as it is replaced)."""
    reg = socket_identity(plugin.registration_socket)
    shutil.rmtree(plugin.plugin_dir)
    eventually(lambda: plugin.dra_socket.is_socket() and plugin.registration_socket.is_socket()
               and socket_identity(plugin.registration_socket) != reg,
               "the DRA socket in its directory made again, and a registration socket for it")
    registers_and_prepares(kubelet, plugin, "uid-1")


def test_a_stopped_plugin_binds_nothing_again(root: Path, driver: ToyDriver) -> None:
    p = KubeletPlugin(DRIVER, driver, kubelet_root=root, watch_sockets=True)
    p.start()
    keeper = p._keeper
    p.stop(grace=0)
    assert keeper is not None and keeper.check_once() == []
    p._rebind(["registration", "dra"])  # a rebind that lost the race with stop() does nothing
    assert not p.registration_socket.exists() and not p.dra_socket.exists() and not p.running


def test_the_keeper_polls_where_there_is_no_inotify(tmp_path: Path) -> None:
    """Without inotify (or for a change it does not report) the poll alone notices a socket gone."""
    root, cleanup = short_root(tmp_path)
    sock_path = root / "run" / "x.sock"
    sock_path.parent.mkdir()
    bound: list[socket.socket] = []

    def bind(names: list[str]) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock_path))
        bound.append(s)
        keeper.mark("x")

    keeper = SocketKeeper({"x": (sock_path, sock_path.parent)}, bind, poll_interval=0.05, use_inotify=False)
    try:
        bind(["x"])
        keeper.start()
        assert keeper._watcher.inotify_active is False
        first = socket_identity(sock_path)
        sock_path.unlink()
        eventually(lambda: keeper.rebinds == 1 and socket_identity(sock_path) not in (None, first), "a new socket")
    finally:
        keeper.stop()
        for s in bound:
            s.close()
        cleanup()
