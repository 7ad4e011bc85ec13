"""Shared fixtures: simulated hosts (sysfs tree + kernel write model) under ``tmp_path``.

``sim`` is the default preset; ``make_sim(preset_or_spec)`` builds any other one, each in
its own directory. The builders themselves live in :mod:`tests.support.simnodes`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mdev_manager.sim import HostSpec
from tests.support import sandbox, tmp
from tests.support.simnodes import Holder, Sim, SimHolder, build_sim

_SANDBOX = pytest.StashKey[bool]()


def pytest_configure(config):
    """Temporary files on tmpfs where /tmp is a disk (tests/support/tmp.py says why), and a home of
    the tests' own (tests/support/sandbox.py); xdist's workers inherit ``TMPDIR``, pytest's base
    temporary directory and that home from the controller."""
    root = tmp.fast_root()
    if root is not None:
        tmp.use(root)
    config.stash[_SANDBOX] = sandbox.enter()  # the tests' own home (tests/support/sandbox.py)


def pytest_unconfigure(config):
    if config.stash.get(_SANDBOX, False):
        sandbox.leave()


@pytest.fixture(autouse=True)
def _own_simulated_hosts(tmp_path_factory, monkeypatch):
    """Each test's ``vgpuctl --simulate PRESET`` (in process or in a subprocess) builds its hosts
    afresh in a directory of its own: no test sees a layout another test, or the user, applied."""
    d = tmp_path_factory.mktemp("sims")
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(d))
    yield
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _simulated_clusters_in_the_temporary_directory():
    """A ``SimCluster`` keeps its node under /tmp unless given a ``base`` (short socket paths):
    here under the tests' temporary directory where that is short too (tmpfs, tests/support/tmp.py)."""
    root = tmp.short_root()
    from dra_bridge.sim.cluster import SimCluster

    defaults = SimCluster.__init__.__kwdefaults__ or {}
    if root == "/tmp" or defaults.get("base", "") is not None:
        yield
        return
    defaults["base"] = Path(root)
    try:
        yield
    finally:
        defaults["base"] = None


@pytest.fixture
def make_sim(tmp_path):
    """Factory: ``make_sim("a100-node")`` or ``make_sim(HostSpec(...))``, each in its own directory."""
    made = []

    def make(preset: str | HostSpec = "default", **env_changes) -> Sim:
        name = preset if isinstance(preset, str) else f"spec{len(made)}"
        root = tmp_path / f"host-{len(made)}-{name}"
        sim = build_sim(root, preset, **env_changes)
        made.append(sim)
        return sim

    return make


@pytest.fixture
def sim(make_sim) -> Sim:
    """The default preset: 2 x T4 (mdev on the PF), A100 40GB (mdev on VFs), L40S (vendor VFIO)."""
    return make_sim("default")


@pytest.fixture
def hold(tmp_path):
    """``hold(path, ...)`` starts a real child process holding the paths open; killed at teardown.

    The manager sees it on the real /proc only: through ``h.view(sim)`` (``sim.with_real_proc()``).
    """
    holders: list[Holder] = []

    def start(*paths: Path) -> Holder:
        for p in paths:
            assert Path(p).exists(), f"{p} does not exist"
        h = Holder(list(paths), tmp_path)
        holders.append(h)
        return h

    yield start
    for h in holders:
        h.release()


@pytest.fixture(params=["real", "simulated"])
def holder(request, hold):
    """``holder(sim, path, ...)``: a real child process, or a simulated process of ``sim``'s
    host, holding the paths open (each test runs with both). ``.pid``, ``.release()``, and
    ``.view(sim)``: the ``Sim`` through which the manager sees that holder."""

    def start(sim: Sim, *paths: Path) -> Holder | SimHolder:
        if request.param == "real":
            return hold(*paths)
        return SimHolder(sim, list(paths))

    return start


#: Tests of several seconds each (node id prefixes, longest first). Under xdist they start first, so
#: that the workers end together instead of one finishing a campaign alone; order only, nothing skips.
LONG_FIRST = (
    "tests/system/test_e2e_serve.py",  # a control plane per minor (1.37, 1.34), eight tests each, nodes as processes
    "tests/system/test_campaign.py",
    "tests/system/test_real_rbac.py",  # one test: a control plane, the DaemonSet's pod, a claim (~35 s)
    "tests/system/test_real_kubevirt.py",  # a control plane with KubeVirt's CRDs; drain --migrate (~3 min)
    "tests/system/test_real_kubelet_dra.py",  # a control plane, vgpuctl serve, the kubelet's DRA manager (~50 s)
    "tests/system/test_output.py::test_apply_on_the_largest_preset_fits_one_screen",
    "tests/mdev_manager/test_crash.py",
    "tests/system/test_no_overcommit.py",
    "tests/dra_bridge/test_conformance.py",
    "tests/system/test_binding_conditions.py",
    "tests/system/test_demo.py",
    "tests/system/test_serve.py",
    "tests/system/test_bad_input.py::test_kubeconfig_missing_invalid_unreachable",
    "tests/system/test_output_cli.py::test_capacity_without_a_cluster_says_it_is_an_example",
    "tests/dra_bridge/test_slices.py::test_sixteen_gpus_at_scale",
    "tests/system/test_doctor.py::test_the_command",
)


#: Module-scoped fixtures that take seconds to build (test file -> fixture): under xdist with
#: ``--dist loadgroup`` the tests using one go to the same worker, which builds it once.
SHARED_FIXTURES = {
    "tests/dra_bridge/test_conformance.py": "passing",
    "tests/system/test_e2e_serve.py": "cp",
    "tests/system/test_demo.py": "report",
    "tests/system/test_real_kubevirt.py": "cp",
    "tests/system/test_real_kubelet_dra.py": "node",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """In an xdist worker (each collects the same list, the controller hands out indices into it):
    the long tests first, each module's tests kept in their order; the users of a shared fixture
    (of one of its values, where it is parametrized) in one group."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def rank(item) -> int:
        return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    items.sort(key=rank)
    for item in items:
        path = item.nodeid.split("::")[0]
        fixture = SHARED_FIXTURES.get(path)
        if fixture in getattr(item, "fixturenames", ()):
            # a parametrized fixture (a control plane per Kubernetes minor): one group per value, so
            # the minors' control planes can run on two workers side by side
            param = getattr(getattr(item, "callspec", None), "params", {}).get(fixture)
            item.add_marker(pytest.mark.xdist_group(f"{path}::{fixture}" + (f"[{param}]" if param else "")))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; without xdist it is never called
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than there are CPUs. A worker spends about a fifth of its time with
    nothing to run (the conformance checks' settle periods, resync intervals, servers and subprocesses
    starting), which another worker's tests fill. $PYTEST_XDIST_AUTO_NUM_WORKERS still decides if set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cpus + 1


def pytest_report_header(config):
    """Which kubelet protos the test kubelet was built from (upstream, or the test's own copies)."""
    from tests.support.kubelet import protos

    return f"kubelet protos: {protos.SOURCE}"
