"""The packing benchmark's three policies on streams small enough to count by hand."""

from __future__ import annotations

import pytest

from benchmarks.bench_packing import _Scheduler, placement_table, run, simulate
from tests.support.upstream_allocator import real_or_model

L40S = placement_table("L40S")[:2]


def claims(*sizes, stay=float("inf")):
    return [(s, float(t), t + stay) for t, s in enumerate(sizes)]


def test_one_l40s_takes_8_x_4c_mixed_and_12_equal():
    """Mixed-size mode keeps the largest power of two not above 12 placements for 4C [RM]."""
    stream = claims(*[4] * 13)
    assert simulate("mixed", *L40S, stream, 1).refused == 5
    assert simulate("equal", *L40S, stream, 1).refused == 1
    assert simulate("bound", *L40S, stream, 1).refused == 1


def test_sizes_share_a_gpu_only_in_mixed_mode_and_first_fit_is_not_perfect():
    """8C at 0, 16C at 32 (0 is held), then 24C fits neither at 0 nor at 24: a second GPU, though
    16C at 0, 8C at 16, 24C at 24 would fill one."""
    stream = claims(8, 16, 24)
    assert simulate("mixed", *L40S, stream, None).gpus_used == 2
    assert simulate("equal", *L40S, stream, None).gpus_used == 3
    assert simulate("bound", *L40S, stream, None).gpus_used == 1
    assert simulate("mixed", *L40S, claims(24, 8, 16), 1).refused == 0  # 24C at 0, 8C at 24, 16C at 32


def test_departures_free_their_slots():
    stream = [(8, 0.0, 1.5), (24, 1.0, float("inf")), (16, 5.0, float("inf"))]  # 8C at 0, 24C at 24
    assert simulate("mixed", *L40S, [(8, 0.0, float("inf")), *stream[1:]], 1).refused == 1  # 16C: 0 and 32 held
    assert simulate("mixed", *L40S, stream, 1).refused == 0  # the 8C left: 16C at 0
    assert simulate("equal", *L40S, [(8, 0.0, 1.0), (16, 2.0, 3.0)], 1).refused == 0  # an emptied GPU takes any size


def test_the_benchmark_prints_a_row_per_measure():
    lines = run(fleet=4, scheduler=False)
    assert len(lines) == 2 + 2 * 3 and all("bound" in ln or "fluid" in ln for ln in lines[2:])


def test_the_tables_are_the_catalogs():
    """The benchmark packs by the placements the node manager places by and the DRA bridge publishes."""
    from mdev_manager import catalog_placements

    for board in ("L40S", "H100-80GB"):
        assert placement_table(board) == (catalog_placements.slots(board), catalog_placements.placements(board),
                                          "catalog")


@pytest.mark.go
def test_the_scheduler_packs_as_first_fit_on_published_gpus():
    """The benchmark's first fit is what the scheduler does with the published slices: Kubernetes'
    own allocator (1.36, the benchmark's; the model where Go is absent) on one and two published
    L40S in mixed-size mode refuses what first fit refuses."""
    up = real_or_model("1.36")
    for stream, fleet in ((claims(*[4] * 13), 1), (claims(24, 8, 16), 1), (claims(8, 16, 24, 48, 4), 2),
                          ([(8, 0.0, 1.5), (24, 1.0, float("inf")), (16, 5.0, float("inf"))], 1)):
        got = simulate(_Scheduler("L40S", fleet, up), *L40S, stream, fleet)
        assert got == simulate("mixed", *L40S, stream, fleet), stream
    assert simulate(_Scheduler("L40S", 1, up), *L40S, claims(*[4] * 13), 1).refused == 5
