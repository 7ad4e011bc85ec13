"""MIG GPU-instance profiles of the boards that have MIG, as NVML reports them.

Sources (cited per table below): NVIDIA's MIG user guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html), and
``nvidia-smi mig -lgip`` / ``-lgipp`` outputs of the boards. A row is one profile:
``(name, NVML profile id, max instances, memory MiB, SMs, copy engines, decoders, encoders,
JPEG, OFA, placement starts, placement size)``. The simulated host builds its NVML from these
tables; the node manager and the DRA bridge read profiles from NVML, never from here.
"""

from __future__ import annotations

from functools import cache

from mdev_manager.models import GpuInstanceProfile, MigPlacement

Row = tuple[str, int, int, int, int, int, int, int, int, int, tuple[int, ...], int]


def _profiles(rows: list[Row]) -> list[GpuInstanceProfile]:
    return [GpuInstanceProfile(id=pid, name=name, slices=int(name.split("g.")[0]), instances=n, memory_mib=mib,
                               multiprocessors=sm, copy_engines=ce, decoders=dec, encoders=enc, jpeg_engines=jpg,
                               ofa_engines=ofa, placements=[MigPlacement(start=s, size=size) for s in starts])
            for name, pid, n, mib, sm, ce, dec, enc, jpg, ofa, starts, size in rows]


# A few memory sizes differ by 128-256 MiB between driver branches; one branch's values are kept.
# A30 24GB: MIG user guide (A30 table) and `nvidia-smi mig -lgip`/`-lgipp` on an A30 (1g.6gb has
# one decoder there, where the guide's table says none: nvidia-smi wins). 4 memory slices.
_A30: list[Row] = [
    ("1g.6gb", 14, 4, 5952, 14, 1, 1, 0, 0, 0, (0, 1, 2, 3), 1),
    ("1g.6gb+me", 21, 1, 5952, 14, 1, 1, 0, 1, 1, (0, 1, 2, 3), 1),
    ("2g.12gb", 5, 2, 11968, 28, 2, 2, 0, 0, 0, (0, 2), 2),
    ("2g.12gb+me", 6, 1, 11968, 28, 2, 2, 0, 1, 1, (0, 2), 2),
    ("4g.24gb", 0, 1, 24000, 56, 4, 4, 0, 1, 1, (0,), 4),
]

# A100 40GB (SXM4 and PCIe): MIG user guide (A100 table and its -lgip / -lgipp example,
# A100-SXM4-40GB); 1g.10gb (id 15) exists from R525 on. 8 memory slices, 7 compute slices.
_A100_40GB: list[Row] = [
    ("1g.5gb", 19, 7, 4864, 14, 1, 0, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.5gb+me", 20, 1, 4864, 14, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.10gb", 15, 4, 9856, 14, 1, 1, 0, 0, 0, (0, 2, 4, 6), 2),
    ("2g.10gb", 14, 3, 9856, 28, 2, 1, 0, 0, 0, (0, 2, 4), 2),
    ("3g.20gb", 9, 2, 19968, 42, 3, 2, 0, 0, 0, (0, 4), 4),
    ("4g.20gb", 5, 1, 19968, 56, 4, 2, 0, 0, 0, (0,), 4),
    ("7g.40gb", 0, 1, 40192, 98, 7, 5, 0, 1, 1, (0,), 8),
]

# A100 80GB (SXM4 and PCIe): the guide: "profile names change according to the memory
# proportion"; -lgip of an A100-SXM4-80GB; placements as on the 40GB board.
_A100_80GB: list[Row] = [
    ("1g.10gb", 19, 7, 9728, 14, 1, 0, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.10gb+me", 20, 1, 9728, 14, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.20gb", 15, 4, 19968, 14, 1, 1, 0, 0, 0, (0, 2, 4, 6), 2),
    ("2g.20gb", 14, 3, 19968, 28, 2, 1, 0, 0, 0, (0, 2, 4), 2),
    ("3g.40gb", 9, 2, 40192, 42, 3, 2, 0, 0, 0, (0, 4), 4),
    ("4g.40gb", 5, 1, 40192, 56, 4, 2, 0, 0, 0, (0,), 4),
    ("7g.80gb", 0, 1, 80896, 98, 7, 5, 0, 1, 1, (0,), 8),
]

# H100 80GB HBM3 (SXM5): -lgip / -lgipp of an "NVIDIA H100 80GB HBM3"; the guide's H100 table
# (1g.10gb: 1 NVDEC, 1 JPEG; 7g.80gb: 7 NVDEC, 7 JPEG, 1 OFA, 8 copy engines).
_H100_80GB: list[Row] = [
    ("1g.10gb", 19, 7, 9984, 16, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.10gb+me", 20, 1, 9984, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.20gb", 15, 4, 20096, 26, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.20gb", 14, 3, 20096, 32, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.40gb", 9, 2, 40448, 60, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.40gb", 5, 1, 40448, 64, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.80gb", 0, 1, 81152, 132, 8, 7, 0, 7, 1, (0,), 8),
]

# H100 NVL 94GB: -lgip / -lgipp on driver 560.35.03 (NVIDIA/gpu-operator#900, NVIDIA/mig-parted#101).
_H100_NVL: list[Row] = [
    ("1g.12gb", 19, 7, 11008, 16, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.12gb+me", 20, 1, 11008, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.24gb", 15, 4, 22144, 26, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.24gb", 14, 3, 22144, 32, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.47gb", 9, 2, 47488, 60, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.47gb", 5, 1, 47488, 64, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.94gb", 0, 1, 95360, 132, 8, 7, 0, 7, 1, (0,), 8),
]

# H200 141GB: -lgip rows 1g.18gb .. 4g.71gb (NVIDIA/mig-parted#120), 7g.141gb and the engines from
# the guide's H200 table; placements follow the guide's memory fractions, the same as H100's
# (no -lgipp output of an H200 was found: the geometry is taken from H100).
_H200: list[Row] = [
    ("1g.18gb", 19, 7, 16384, 16, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.18gb+me", 20, 1, 16384, 16, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.35gb", 15, 4, 33024, 26, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
    ("2g.35gb", 14, 3, 33024, 32, 2, 2, 0, 2, 0, (0, 2, 4), 2),
    ("3g.71gb", 9, 2, 71168, 60, 3, 3, 0, 3, 0, (0, 4), 4),
    ("4g.71gb", 5, 1, 71168, 64, 4, 4, 0, 4, 0, (0,), 4),
    ("7g.141gb", 0, 1, 143360, 132, 8, 7, 0, 7, 1, (0,), 8),
]

# Not here: B200 (its 3g/4g/7g rows could not be verified) and RTX PRO 6000 Blackwell (MIG on
# 12 placement units, and time-sliced vGPUs inside one GPU instance): their boards offer
# time-sliced types only until their tables are confirmed.
MIG_TABLES: dict[str, list[Row]] = {
    "A30": _A30,
    "A100-40GB": _A100_40GB,
    "A100D-80GB": _A100_80GB,
    "H100-80GB": _H100_80GB,
    "H100-NVL": _H100_NVL,
    "H200": _H200,
}

#: Memory slices per board: the widest placement's end.
MEMORY_SLICES: dict[str, int] = {k: max(s + size for *_, starts, size in rows for s in starts)
                                 for k, rows in MIG_TABLES.items()}


@cache
def mig_profiles(board_key: str) -> tuple[GpuInstanceProfile, ...]:
    """The board's GPU-instance profiles; () for a board without MIG."""
    return tuple(_profiles(MIG_TABLES.get(board_key, [])))


def has_mig(board_key: str) -> bool:
    return board_key in MIG_TABLES
