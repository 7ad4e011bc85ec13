"""dra_bridge.apiclient.publisher against a local API server: layout per version, fewest writes, retries."""

from __future__ import annotations

import copy

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from dra_bridge.api.names import LABEL_ROLE
from dra_bridge.apiclient.publisher import Publisher, server_version
from dra_bridge.pool.devices import Pool
from dra_bridge.pool.slices import build_slices
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.config import GpuLayout
from mdev_manager.sim.hostspec import GpuGroup, HostSpec
from tests.support.dra import (
    DRIVER,
    VERSIONS,
    assert_consistent_pool,
    make_node,
    pool_slices,
    published_devices,
    schema_validate,
    strip_server_fields,
    version_tuple,
)

OTHER_DRIVER = "gpu.example.com"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """One simulated default node per server version (pool built for that version)."""
    out = {}
    for v in VERSIONS:
        out[v] = make_node(tmp_path_factory.mktemp(f"pub{v}"), "default", version=version_tuple(v))
    return out


def publisher(srv, node, **kw) -> Publisher:
    kw.setdefault("sleep", lambda s: None)
    return Publisher(srv.api_client(), driver=DRIVER, node_name=node.node, **kw)


def foreign_slice(name: str, *, node: str, driver: str, pool: str | None = None, generation: int = 1) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
                 "devices": [{"name": "dev-0", "attributes": {"model": {"string": "x"}}}]},
    }


def content(slices: list[dict]) -> dict[str, dict]:
    """Slices by name, without server metadata and generation (what the scheduler reads)."""
    out = {}
    for s in slices:
        spec = copy.deepcopy(s["spec"])
        spec["pool"].pop("generation")
        out[s["metadata"]["name"]] = spec
    return out


def small_node(root, version: str):
    """Eight T4s offering two sizes each (on 1.37: 1 GiB and 2 GiB; before it, the first's 16
    slots): several slices on every version (136 devices pass a 1.34 slice's 128), cheap to snapshot."""
    spec = HostSpec(name="t4-8", node="sim-t4", gpus=[GpuGroup(board="T4", count=8)])
    node = make_node(root, spec, version=version_tuple(version))
    node.layouts = [GpuLayout(all=True, mode="dra", passthrough=True, vgpus={"T4-1Q": 0, "T4-2Q": 0, "T4-1A": 0})]
    return node


class Recorder:
    """Wraps the publisher's ResourceV1Api and snapshots the pool after every write."""

    WRITES = ("create_resource_slice", "replace_resource_slice", "delete_resource_slice")

    def __init__(self, api, srv, node_name: str):
        self._api, self._srv, self._node = api, srv, node_name
        self.states: list[list[dict]] = []

    def __getattr__(self, name):
        attr = getattr(self._api, name)
        if name not in self.WRITES:
            return attr

        def call(*a, **kw):
            try:
                return attr(*a, **kw)
            finally:
                self.states.append(pool_slices(self._srv, node=self._node))
        return call


def visible_pool(slices: list[dict]) -> list[dict] | None:
    """What the scheduler uses: the newest generation's slices, if all of them are visible."""
    if not slices:
        return None
    newest = max(s["spec"]["pool"]["generation"] for s in slices)
    cur = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
    if any(s["spec"]["pool"]["resourceSliceCount"] != len(cur) for s in cur):
        return None  # incomplete: not allocated from
    return cur


def assert_never_mixed(states: list[list[dict]], before: dict, after: dict) -> None:
    """Every complete pool the scheduler could see during the sync is the old one or the new one."""
    for i, state in enumerate(states):
        seen = visible_pool(state)
        if seen is None:
            continue
        c = content(seen)
        assert c in (before, after), f"after write {i + 1} the scheduler sees a pool that is neither the old nor the new one"


# --------------------------------------------------------------------------- layout and validation per version


@pytest.mark.parametrize("version", VERSIONS)
def test_publish_layout_and_schema_per_version(nodes, version):
    node = nodes[version]
    pool = node.build_pool()
    with LocalApiServer(version=version) as srv:
        pub = publisher(srv, node)  # version read from /version
        res = pub.sync(pool)
        assert pub.version == version_tuple(version)
        slices = pool_slices(srv, node=node.node)
        assert res.created == len(slices) > 0 and res.updated == res.deleted == 0
        assert_consistent_pool(slices)
        # every object the bridge wrote validates against the official schema of that version
        for s in slices:
            schema_validate(strip_server_fields(s), version)
        # every device of the pool is published exactly once
        names = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
        assert sorted(names) == sorted(d.name for d in pool.devices)

        sets_by_slice = [{c["name"] for c in s["spec"].get("sharedCounters") or []} for s in slices]
        all_sets = set().union(*sets_by_slice)
        assert all_sets == {c.name for c in pool.counter_sets}
        groups = [c.get("compatibilityGroups") for s in slices for d in s["spec"].get("devices") or []
                  for c in d.get("consumesCounters") or []]
        if version == "1.34":
            # combined: each device shares its slice with every counter set it consumes
            assert any(s["spec"].get("devices") and s["spec"].get("sharedCounters") for s in slices)
            for s, own in zip(slices, sets_by_slice, strict=False):
                for d in s["spec"].get("devices") or []:
                    assert {c["counterSet"] for c in d.get("consumesCounters") or []} <= own
        else:
            # 1.35+: a counters-only slice, then devices-only slices
            for s in slices:
                assert not (s["spec"].get("devices") and s["spec"].get("sharedCounters")), s["metadata"]["name"]
            by_number = sorted(slices, key=lambda s: int(s["metadata"]["name"].rsplit("-", 1)[1]))
            roles = [s["metadata"]["labels"][LABEL_ROLE] for s in by_number]
            assert roles[0] == "counters" and set(roles[1:]) == {"devices"}
            for d in (d for s in slices for d in s["spec"].get("devices") or []):
                for c in d.get("consumesCounters") or []:
                    assert c["counterSet"] in all_sets
        if version == "1.37":
            vgpu_groups = [g for g in groups if g]
            assert vgpu_groups and all(len(g) <= 2 for g in vgpu_groups)
            # several framebuffer sizes of one GPU are offered, told apart by groups
            assert len({g[0] for g in vgpu_groups}) > 1
        else:
            assert all(g is None for g in groups), "compatibilityGroups published to a server older than 1.37"


@pytest.mark.parametrize("server,built_for", [("1.35", "1.34"), ("1.36", "1.34"), ("1.37", "1.34"),
                                               ("1.34", "1.37"), ("1.35", "1.37"), ("1.36", "1.37")])
def test_slices_built_for_another_version_are_rejected(nodes, server, built_for):
    """The server really validates: combined slices on 1.35+, compatibility groups before 1.37 are 422."""
    node = nodes[built_for]
    bodies = build_slices(node.build_pool(), driver=DRIVER, node_name=node.node, pool_name=node.node,
                          generation=1, server_version=version_tuple(built_for))
    with LocalApiServer(version=server) as srv:
        pub = publisher(srv, node, version=version_tuple(server))
        statuses = [_create_status(pub, b) for b in bodies]
        assert 422 in statuses, f"server {server} accepted every slice built for {built_for}"


def _create_status(pub: Publisher, body: dict) -> int:
    try:
        pub.api.create_resource_slice(body)
    except ApiException as exc:
        return exc.status
    return 201


def test_version_override_skips_version_lookup(nodes):
    node = nodes["1.35"]
    with LocalApiServer(version="1.37") as srv:
        pub = publisher(srv, node, version=(1, 35))
        pub.sync(node.build_pool())
        assert not [r for r in srv.request_log if r.path.startswith("/version")]
        slices = pool_slices(srv, node=node.node)
        assert not any(c.get("compatibilityGroups") for s in slices for d in s["spec"].get("devices") or []
                       for c in d.get("consumesCounters") or [])
        assert pub.version == (1, 35)


def test_server_version_parses_minor_with_plus():
    with LocalApiServer(version="1.36") as srv:
        info = srv.version_info()
        info["minor"] = "36+"
        srv.version_info = lambda: info  # as GKE/EKS report it
        assert server_version(srv.api_client()) == (1, 36)


# --------------------------------------------------------------------------- fewest writes


@pytest.mark.parametrize("version", VERSIONS)
def test_unchanged_resync_writes_nothing(nodes, version):
    node = nodes[version]
    with LocalApiServer(version=version) as srv:
        publisher(srv, node).sync(node.build_pool())
        before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in pool_slices(srv)}
        srv.reset_counters()
        res = publisher(srv, node).sync(node.build_pool())  # a restarted daemon, same node state
        assert res.writes == 0
        assert srv.writes == []
        assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in pool_slices(srv)} == before


@pytest.mark.parametrize("version", VERSIONS)
def test_one_changed_slice_is_one_write(nodes, version):
    node = nodes[version]
    pool = node.build_pool()
    with LocalApiServer(version=version) as srv:
        pub = publisher(srv, node)
        gen0 = pub.sync(pool).generation
        before = {s["metadata"]["name"]: s for s in pool_slices(srv)}
        changed = pool.model_copy(deep=True)
        target = changed.devices[-1]
        target.attributes["productName"] = {"string": "renamed board"}
        srv.reset_counters()
        res = pub.sync(changed)
        assert res.writes == 1 and res.updated == 1
        assert len(srv.writes) == 1 and srv.writes[0].verb == "update"
        after = pool_slices(srv)
        holder = next(s for s in after if target.name in {d["name"] for d in s["spec"].get("devices") or []})
        assert srv.writes[0].name == holder["metadata"]["name"]
        dev = next(d for d in holder["spec"]["devices"] if d["name"] == target.name)
        assert dev["attributes"]["productName"] == {"string": "renamed board"}
        # the untouched slices were not rewritten
        for s in after:
            if s["metadata"]["name"] != holder["metadata"]["name"]:
                assert s["metadata"]["resourceVersion"] == before[s["metadata"]["name"]]["metadata"]["resourceVersion"]
        assert assert_consistent_pool(after) >= gen0


@pytest.mark.parametrize("version", ["1.34", "1.35"])
def test_changes_in_several_slices_never_show_a_mixed_pool(tmp_path, version):
    """Two slices change in one sync: the scheduler must never see half old, half new as one pool."""
    node = small_node(tmp_path, version)
    pool = node.build_pool()
    with LocalApiServer(version=version) as srv:
        pub = publisher(srv, node)
        pub.sync(pool)
        slices = pool_slices(srv)
        with_devices = [s for s in slices if s["spec"].get("devices")]
        changed = pool.model_copy(deep=True)
        assert len(with_devices) >= 2
        picks = {with_devices[0]["spec"]["devices"][0]["name"], with_devices[-1]["spec"]["devices"][0]["name"]}
        for d in changed.devices:
            if d.name in picks:
                d.attributes["productName"] = {"string": "renamed board"}
        before = content(slices)
        rec = Recorder(pub.api, srv, node.node)
        pub.api = rec
        pub.sync(changed)
        after_slices = pool_slices(srv)
        assert_consistent_pool(after_slices)
        assert_never_mixed(rec.states, before, content(after_slices))


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.37"])
def test_gpu_leaving_and_returning_is_written_in_place(tmp_path, version):
    """A GPU that leaves (or comes back) empties (fills) its own slices at the same generation and slice
    count; every write keeps the other GPUs allocatable (tests/dra_bridge/test_publisher_keep.py)."""
    node = small_node(tmp_path, version)
    full = node.build_pool()
    gone = full.model_copy(deep=True)
    lost_gpu = "0000:13:00.0"
    gone.devices = [d for d in gone.devices if d.gpu != lost_gpu]
    gone.counter_sets = [c for c in gone.counter_sets
                         if c.name in {x.counter_set for d in gone.devices for x in d.consumes}]
    with LocalApiServer(version=version) as srv:
        pub = publisher(srv, node)
        gen = pub.sync(full).generation
        count = len(pool_slices(srv))
        for pool in (gone, full, gone):
            res = pub.sync(pool)
            after = pool_slices(srv)
            assert assert_consistent_pool(after) == gen == res.generation and len(after) == count
            assert published_devices(after) == {d.name for d in pool.devices}
            assert res.created == res.deleted == 0 and res.updated >= 1
            for s in after:
                schema_validate(strip_server_fields(s), version)


def test_stale_slices_deleted_other_nodes_and_drivers_untouched(nodes):
    node = nodes["1.35"]
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        other_node = srv.add(foreign_slice("other-node-slice", node="sim-node-2", driver=DRIVER))
        other_driver = srv.add(foreign_slice("other-driver-slice", node=node.node, driver=OTHER_DRIVER))
        stale = srv.add(foreign_slice("leftover-of-ours", node=node.node, driver=DRIVER, generation=7))
        srv.add(foreign_slice("ours-old-pool-name", node=node.node, driver=DRIVER, pool="old-pool"))
        res = publisher(srv, node).sync(pool)
        names = {s["metadata"]["name"] for s in srv.objects("resourceslices")}
        assert "leftover-of-ours" not in names
        assert "ours-old-pool-name" not in names, "a slice of this driver and node in a pool it no longer publishes stays"
        assert res.deleted == 2
        for kept in (other_node, other_driver):
            now = srv.get_object("resourceslices", kept["metadata"]["name"])
            assert now is not None and now["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
        ours = pool_slices(srv, node=node.node)
        gen = assert_consistent_pool(ours)
        assert gen > stale["spec"]["pool"]["generation"], "new slices must outrank the leftover generation"


def test_empty_pool_removes_every_slice(nodes):
    node = nodes["1.35"]
    with LocalApiServer(version="1.35") as srv:
        pub = publisher(srv, node)
        pub.sync(node.build_pool())
        srv.add(foreign_slice("other-driver-slice", node=node.node, driver=OTHER_DRIVER))
        res = pub.sync(Pool())
        assert res.created == res.updated == 0 and res.deleted > 0
        assert pool_slices(srv) == []
        assert [s["metadata"]["name"] for s in srv.objects("resourceslices")] == ["other-driver-slice"]
        assert pub.delete_all() == 0


# --------------------------------------------------------------------------- retries


@pytest.mark.parametrize("verb,status", [("create", 503), ("create", 409), ("list", 503), ("list", 429)])
def test_transient_errors_on_first_publish_are_retried(nodes, verb, status):
    node = nodes["1.35"]
    pool = node.build_pool()
    sleeps: list[float] = []
    with LocalApiServer(version="1.35") as srv:
        inj = srv.inject(verb, "resourceslices", status, times=2)
        pub = publisher(srv, node, sleep=sleeps.append)
        pub.sync(pool)
        assert inj.hits == 2
        assert len(sleeps) == 2 and sleeps[1] > sleeps[0] > 0, "backoff must grow"
        slices = pool_slices(srv)
        assert_consistent_pool(slices)
        assert published_devices(slices) == {d.name for d in pool.devices}


@pytest.mark.parametrize("verb,status", [("update", 409), ("update", 503), ("get", 500), ("delete", 503)])
def test_transient_errors_on_update_and_delete_are_retried(nodes, verb, status):
    node = nodes["1.35"]
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        pub = publisher(srv, node)
        pub.sync(pool)
        changed = pool.model_copy(deep=True)
        if verb == "delete":  # drop a GPU and rename another's board: a new generation, a slice must go
            gpu = changed.devices[-1].gpu
            changed.devices = [d for d in changed.devices if d.gpu != gpu]
            changed.devices[0].attributes["productName"] = {"string": "renamed board"}
        else:
            changed.devices[-1].attributes["productName"] = {"string": "renamed board"}
        inj = srv.inject(verb, "resourceslices", status, times=1)
        pub.sync(changed)
        assert inj.hits == 1
        slices = pool_slices(srv)
        assert_consistent_pool(slices)
        assert published_devices(slices) == {d.name for d in changed.devices}
        assert content(slices) == content(build_slices(changed, driver=DRIVER, node_name=node.node,
                                                        pool_name=node.node, generation=0, server_version=(1, 35)))


def test_real_conflict_is_resolved_by_rereading(nodes):
    """Someone else updates a slice between our read and our write: 409, re-read, retry."""
    node = nodes["1.35"]
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        pub = publisher(srv, node)
        pub.sync(pool)
        changed = pool.model_copy(deep=True)
        changed.devices[-1].attributes["productName"] = {"string": "renamed board"}
        api = pub.api
        raced = []

        class Racing:
            def __getattr__(self, name):
                return getattr(api, name)

            def replace_resource_slice(self, name, body, **kw):
                if not raced:  # bump the stored object's resourceVersion behind our back
                    obj = srv.get_object("resourceslices", name)
                    obj["metadata"]["labels"]["touched"] = "yes"
                    api.replace_resource_slice(name, obj)
                    raced.append(name)
                return api.replace_resource_slice(name, body, **kw)

        pub.api = Racing()
        pub.sync(changed)
        assert raced
        conflicts = [r for r in srv.request_log if r.verb == "update" and r.code == 409]
        assert conflicts, "the racing write should have made ours conflict"
        slices = pool_slices(srv)
        dev = next(d for s in slices for d in s["spec"].get("devices") or [] if d["name"] == changed.devices[-1].name)
        assert dev["attributes"]["productName"] == {"string": "renamed board"}


def test_retries_are_bounded_and_permanent_errors_not_retried(nodes):
    node = nodes["1.35"]
    pool = node.build_pool()
    with LocalApiServer(version="1.35") as srv:
        sleeps: list[float] = []
        srv.inject("create", "resourceslices", 503, times=None)
        pub = publisher(srv, node, sleep=sleeps.append, retries=3)
        with pytest.raises(ApiException) as exc:
            pub.sync(pool)
        assert exc.value.status == 503
        assert len(sleeps) == 3
        srv.clear_injections()

        sleeps.clear()
        srv.inject("create", "resourceslices", 403, times=None)
        with pytest.raises(ApiException) as exc:
            pub.sync(pool)
        assert exc.value.status == 403 and sleeps == []


def test_unreachable_server_is_retried_then_raises():
    srv = LocalApiServer(version="1.35").start()
    client = srv.api_client()
    srv.stop()
    sleeps: list[float] = []
    pub = Publisher(client, driver=DRIVER, node_name="n1", version=(1, 35), retries=2, sleep=sleeps.append)
    with pytest.raises(TransportError):
        pub.sync(Pool())
    assert len(sleeps) == 2
