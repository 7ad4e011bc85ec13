"""Checkpoint saves in a storm of prepares (#37): saves that queue behind one write are covered by the
next single write, none returns before its change is on disk, and the text is the same as ever."""

from __future__ import annotations

import threading
import uuid

from dra_bridge.kubeletplugin.checkpoint import CheckpointStore, Serializer, parse, serialize
from dra_bridge.kubeletplugin.state import Checkpoint, ClaimRecord, PreparedDeviceRecord
from mdev_manager.sim import SimIO
from tests.support.dra import make_driver


def _record(i: int) -> ClaimRecord:
    uid = str(uuid.UUID(int=i + 1))
    return ClaimRecord(uid=uid, namespace="ns", name=f"c{i}", devices=[PreparedDeviceRecord(
        request="r", pool="p", device=f"gpu-0-vgpu-{i}", kind="vgpu", gpu="0000:01:00.0", type_id="nvidia-1",
        framework="mdev", parent=f"0000:01:00.{i % 8}", vgpu_id=str(uuid.UUID(int=1000 + i)))])


def test_the_serializer_writes_the_same_text_and_sees_a_record_changed_in_place():
    cp = Checkpoint(claims={r.uid: r for r in map(_record, range(20))})
    s = Serializer()
    assert s(Checkpoint()) == serialize(Checkpoint())
    assert s(cp) == serialize(cp)
    rec = next(iter(cp.claims.values()))
    rec.state = "unpreparing"  # in place, as the driver changes its records
    rec.devices[0].vgpu_id = None
    assert s(cp) == serialize(cp)
    assert parse(s(cp)).claims[rec.uid].state == "unpreparing"


class HeldIO(SimIO):
    """The first checkpoint write waits until released; every write's text is kept."""

    def __init__(self, host):
        super().__init__(host)
        self.started, self.release = threading.Event(), threading.Event()
        self.texts: list[str] = []

    def write_atomic(self, path, data, durable=True):
        if path.name.endswith(".json") and "checkpoint" in path.name:
            if not self.texts:
                self.started.set()
                assert self.release.wait(30)
            self.texts.append(data)
        return super().write_atomic(path, data, durable=durable)


class WatchedLock:
    """A lock that tells how many threads came to take it (a condition to wait on, not a sleep)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cond = threading.Condition()
        self.waiting = 0

    def __enter__(self):
        with self.cond:
            self.waiting += 1
            self.cond.notify_all()
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()


def test_saves_queued_behind_a_write_share_the_next_one_and_none_returns_before_its_change_is_on_disk(
        node, paths, srv):
    io = HeldIO(node.host)
    driver = make_driver(node, paths, srv.api_client(), node.build_pool(), io=io)
    driver.prepared._save_lock = WatchedLock()
    assert driver.store.path.name.endswith(".json") and "checkpoint" in driver.store.path.name
    done: dict[int, int] = {}  # record -> how many writes had completed when its save returned

    def save(i: int) -> None:
        driver.prepared.put(_record(i))
        driver.prepared.save()
        done[i] = len(io.texts)

    first = threading.Thread(target=save, args=(0,))
    first.start()
    assert io.started.wait(30)
    rest = [threading.Thread(target=save, args=(i,)) for i in range(1, 6)]
    for t in rest:
        t.start()
    with driver.prepared._save_lock.cond:  # every later save has numbered its change and waits for the file
        assert driver.prepared._save_lock.cond.wait_for(lambda: driver.prepared._save_lock.waiting == 6, 30)
    assert done == {}  # none answered while the first write is held
    io.release.set()
    for t in [first, *rest]:
        t.join(30)
    assert len(io.texts) == 2 == driver.writes  # six saves, two writes
    assert set(parse(io.texts[1]).claims) == {_record(i).uid for i in range(6)}
    assert all(n >= 1 for n in done.values()) and all(done[i] == 2 for i in range(1, 6))
    assert CheckpointStore(driver.store.path, node.io).load().claims.keys() == driver.cp.claims.keys()
