"""Mixed-size placement tables: every entry NVIDIA publishes, reproduced by the driver's rule.

The published tables are copied here by hand from ../shared/reference/heterogeneous-vgpu.md
([FD]: NVIDIA's vGPU 19 user guide, "vGPU placements for GPUs in mixed-size mode"), so a wrong
rule in :mod:`mdev_manager.catalog_placements` cannot hide on both sides.
"""

from __future__ import annotations

import pytest

from mdev_manager import catalog
from mdev_manager.catalog_placements import BLACKWELL, KNOWN, halving, max_in_mixed_mode, placements, slots, type_placements


def _mult(size: int, slots_: int) -> tuple[int, ...]:
    return tuple(range(0, slots_ - size + 1, size))


_H100_80 = {4: (0, 6, 10, 16, 20, 26, 30, 36, 40, 46, 50, 56, 60, 66, 70, 76), 5: _mult(5, 80),
            8: (0, 12, 20, 32, 40, 52, 60, 72), 10: _mult(10, 80), 16: (0, 24, 40, 64), 20: _mult(20, 80),
            40: (0, 40)}
_L40S = {4: (0, 8, 12, 20, 24, 32, 36, 44), 6: _mult(6, 48), 8: (0, 16, 24, 40), 12: (0, 12, 24, 36), 16: (0, 32),
         24: (0, 24), 48: (0,)}

PUBLISHED = {
    "L40S": _L40S,
    "L40": _L40S,
    "L4": {4: (0, 8, 12, 20), 6: (0, 6, 12, 18), 8: (0, 16), 12: (0, 12)},
    "H100-80GB": _H100_80,
    "A100D-80GB": {s: ids for s, ids in _H100_80.items() if s != 5},  # the catalog's A100D has no 5C
    "A100-40GB": {4: (0, 6, 10, 16, 20, 26, 30, 36), 5: _mult(5, 40), 8: (0, 12, 20, 32), 10: (0, 10, 20, 30),
                  20: (0, 20), 40: (0,)},
    "H100-NVL": {4: (0, 7, 11, 19, 23, 31, 35, 43, 47, 54, 58, 66, 70, 78, 82, 90),
                 6: (0, 17, 23, 41, 47, 64, 70, 88), 11: (0, 12, 23, 36, 47, 59, 70, 83), 15: (0, 32, 47, 79),
                 23: (0, 24, 47, 71), 47: (0, 47), 94: (0,)},
}
SLOTS = {"L40S": 48, "L40": 48, "L4": 24, "H100-80GB": 80, "A100D-80GB": 80, "A100-40GB": 40, "H100-NVL": 94}


@pytest.mark.parametrize("board", sorted(PUBLISHED))
def test_every_published_entry_is_reproduced(board):
    table = placements(board)
    assert slots(board) == SLOTS[board]
    for size, ids in PUBLISHED[board].items():
        assert table[size] == ids, (board, size)


def test_the_published_tables_cover_every_known_board():
    assert set(PUBLISHED) == set(KNOWN) - set(BLACKWELL)  # Blackwell: test_blackwell_placements.py


@pytest.mark.parametrize("board", KNOWN)
def test_placements_of_one_size_never_overlap_and_stay_on_the_gpu(board):
    for size, ids in placements(board).items():
        assert list(ids) == sorted(set(ids))
        assert all(b - a >= size for a, b in zip(ids, ids[1:], strict=False)), (board, size)
        assert ids[-1] + size <= slots(board)


@pytest.mark.parametrize("board, series", [("L40S", "QA"), ("L4", "QC"), ("L40", "QC")])
def test_series_of_one_size_share_placements(board, series):
    b = catalog.board(board)
    by_size: dict[int, set] = {}
    for t in b.types:
        if t.fb_mib and t.fb_mib >= 4096 and t.name[-1] in series:
            by_size.setdefault(t.fb_mib, set()).add(type_placements(board, t.fb_mib))
    assert by_size and all(len(v) == 1 and () not in v for v in by_size.values())


@pytest.mark.parametrize("board, size, equal, mixed", [
    ("L40S", 4, 12, 8), ("L40S", 8, 6, 4), ("L40S", 16, 3, 2), ("L4", 4, 6, 4), ("L4", 8, 3, 2),
    ("H100-80GB", 4, 20, 16), ("H100-80GB", 8, 10, 8), ("H100-80GB", 16, 5, 4), ("H100-NVL", 6, 15, 8),
    ("H100-80GB", 5, 16, 16), ("H100-80GB", 10, 8, 8), ("H100-80GB", 20, 4, 4), ("H100-80GB", 40, 2, 2),
])
def test_mixed_size_maximum_is_the_largest_power_of_two_not_above_the_equal_size_one(board, size, equal, mixed):
    t = next(t for t in catalog.board(board).types if t.fb_mib == size * 1024 and not t.mig_backed)
    assert t.max_instances == equal
    assert max_in_mixed_mode(board, size * 1024) == mixed


def test_one_gib_types_are_left_out():
    assert 1 not in placements("L40S") and 1 not in placements("L4")
    assert type_placements("L40S", 1024) == ()


@pytest.mark.parametrize("board", ["A40", "A16", "T4", "A10", "A30", "H200", "L20", "UHD630"])
def test_boards_without_a_published_table_have_none(board):
    assert placements(board) is None and slots(board) == 0
    assert type_placements(board, 8192) == ()


def test_the_rule_on_its_own():
    # a 16-slot GPU, sizes with maxima 1, 2, 3 (not a power of two), 4
    assert halving(16, {16: 1, 8: 2, 5: 3, 4: 4}) == {16: (0,), 8: (0, 8), 5: (0, 11), 4: (0, 4, 8, 12)}
