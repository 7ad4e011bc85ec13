"""The simulated host's mixed-size mode: NVML's switch and placement lists, the kernel's placements.

Pinned against ../shared/reference/heterogeneous-vgpu.md: the mode switches only on an empty GPU
(NVML_ERROR_IN_USE), not in MIG mode, not on a board without a known table (NOT_SUPPORTED); it
is lost at reboot and driver reload and cleared by enabling or disabling VFs; creation takes the
lowest creatable placement; ``placement_id`` reads it (``Not Applicable`` in equal-size mode) and,
written, moves the vGPU to a creatable placement; creatable placements shrink as slots fill and
return when a whole range frees; ``available_instances`` / ``creatable_vgpu_types`` follow them.
"""

from __future__ import annotations

import errno
import uuid as uuidlib

import pytest

from mdev_manager import catalog
from mdev_manager.discovery import parse_creatable
from mdev_manager.host.nvml import (
    NVML_ERROR_IN_USE,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_INVALID_VGPU_PLACEMENT_ID,
    Mig,
    NvmlError,
)
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from mdev_manager.sim.rules import vf_address

PF = "0000:10:00.0"


def one(board: str, **kw) -> HostSpec:
    return HostSpec(gpus=[GpuGroup(board=board, **kw)])


def num(board: str, short: str) -> str:
    """A type's id by its short name, with or without the board (``8Q``, ``L4-8C``)."""
    name = short if "-" in short else f"{board}-{short}"
    return str(next(t.num for t in catalog.board(board).types if t.short_name == name))


def vf(i: int) -> str:
    return vf_address(PF, i)


def nvml(sim):
    return sim.io.nvml()


def set_type(sim, i: int, board: str, short: str) -> None:
    sim.io.write(sim.env.pci(vf(i)) / "nvidia/current_vgpu_type", num(board, short) + "\n")


def placement(sim, i: int) -> str:
    return (sim.env.pci(vf(i)) / "nvidia/placement_id").read_text().strip()


def move(sim, i: int, to: int) -> None:
    sim.io.write(sim.env.pci(vf(i)) / "nvidia/placement_id", f"{to}\n")


def code(fn, *args) -> int:
    with pytest.raises(NvmlError) as e:
        fn(*args)
    return e.value.code


def errno_of(fn, *args) -> int:
    with pytest.raises(OSError) as e:
        fn(*args)
    return e.value.errno


def creatable_types(sim, i: int) -> set[str]:
    text = (sim.env.pci(vf(i)) / "nvidia/creatable_vgpu_types").read_text()
    return {name.split()[-1] for _, name in parse_creatable(text)}


@pytest.fixture
def l40s(make_sim):
    """One L40S on vendor-specific VFIO, VFs enabled, switched to mixed-size mode after boot."""
    return make_sim(one("L40S", vfs_enabled=True, mixed_size=True))


# --------------------------------------------------------------------------- the mode
def test_the_mode_switches_only_on_an_empty_gpu(make_sim):
    sim = make_sim(one("L40S", vfs_enabled=True))
    n = nvml(sim)
    assert n.vgpu_heterogeneous_mode(PF) == 0
    set_type(sim, 0, "L40S", "8Q")
    assert code(n.set_vgpu_heterogeneous_mode, PF, 1) == NVML_ERROR_IN_USE
    assert n.vgpu_heterogeneous_mode(PF) == 0
    sim.io.write(sim.env.pci(vf(0)) / "nvidia/current_vgpu_type", "0\n")
    n.set_vgpu_heterogeneous_mode(PF, 1)
    assert n.vgpu_heterogeneous_mode(PF) == 1
    assert code(n.set_vgpu_heterogeneous_mode, PF, 2) == NVML_ERROR_INVALID_ARGUMENT


@pytest.mark.parametrize("board", ["T4", "A40", "A16"])
def test_a_board_without_a_known_table_refuses_the_mode(make_sim, board):
    sim = make_sim(one(board))
    addr = sim.host.gpus()[0]["pf"]
    n = nvml(sim)
    for fn, args in ((n.vgpu_heterogeneous_mode, ()), (n.set_vgpu_heterogeneous_mode, (1,)),
                     (n.vgpu_type_supported_placements, (int(num(board, f"{board}-4Q")),))):
        assert code(fn, addr, *args) == NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(ValueError, match=f"{board} has no known mixed-size placement table"):
        one(board, mixed_size=True)


def test_mig_mode_refuses_the_mode_and_enabling_mig_clears_it(make_sim):
    sim = make_sim(one("H100-80GB", mixed_size=True))
    n = nvml(sim)
    assert n.vgpu_heterogeneous_mode(PF) == 1
    Mig(n).set_mode(PF, True)
    assert code(n.vgpu_heterogeneous_mode, PF) == NVML_ERROR_NOT_SUPPORTED
    assert code(n.set_vgpu_heterogeneous_mode, PF, 1) == NVML_ERROR_NOT_SUPPORTED
    Mig(n).set_mode(PF, False)
    assert n.vgpu_heterogeneous_mode(PF) == 0


def test_reboot_driver_reload_and_vf_changes_clear_the_mode(make_sim):
    sim = make_sim(one("L40S", mixed_size=True))  # VFs off: enabling them comes after the switch
    n = nvml(sim)
    assert n.vgpu_heterogeneous_mode(PF) == 1
    sim.io.write(sim.env.pci(PF) / "sriov_numvfs", "32\n")
    assert n.vgpu_heterogeneous_mode(PF) == 0  # sriov-manage -e: set the mode after it
    n.set_vgpu_heterogeneous_mode(PF, 1)
    sim.io.write(sim.env.pci(PF) / "sriov_numvfs", "0\n")
    assert n.vgpu_heterogeneous_mode(PF) == 0  # and -d
    n.set_vgpu_heterogeneous_mode(PF, 1)
    sim.io.write(sim.env.pci_drivers / "nvidia/unbind", PF)  # driver reload: unbind, bind again
    assert code(n.set_vgpu_heterogeneous_mode, PF, 1) == NVML_ERROR_NOT_FOUND  # NVML sees no GPU off nvidia
    sim.io.write(sim.env.pci_drivers / "nvidia/bind", PF)
    assert n.vgpu_heterogeneous_mode(PF) == 0
    n.set_vgpu_heterogeneous_mode(PF, 1)
    sim.host.reboot()
    assert n.vgpu_heterogeneous_mode(PF) == 0


# --------------------------------------------------------------------------- placements
def test_creation_takes_the_lowest_creatable_placement(l40s):
    set_type(l40s, 0, "L40S", "8Q")
    set_type(l40s, 1, "L40S", "4Q")  # 4 GiB ids 0, 8, 12, ...: 0 is under the 8Q, 8 is free
    set_type(l40s, 2, "L40S", "8Q")  # 8 GiB ids 0, 16, 24, 40
    assert [placement(l40s, i) for i in range(3)] == ["0", "8", "16"]
    n = nvml(l40s)
    assert [n.vgpu_placement_id(PF, vf(i)) for i in range(3)] == [0, 8, 16]
    assert n.vgpu_type_creatable_placements(PF, int(num("L40S", "8Q"))) == (8, [24, 40])
    assert n.vgpu_type_creatable_placements(PF, int(num("L40S", "4Q"))) == (4, [12, 24, 32, 36, 44])
    assert n.vgpu_type_creatable_placements(PF, int(num("L40S", "24Q"))) == (24, [24])
    assert n.vgpu_type_supported_placements(PF, int(num("L40S", "24Q"))) == (24, [0, 24])


def test_placement_id_appears_with_a_type_and_reads_not_applicable_in_equal_size_mode(make_sim):
    sim = make_sim(one("L40S", vfs_enabled=True))
    assert not (sim.env.pci(vf(0)) / "nvidia/placement_id").exists()
    set_type(sim, 0, "L40S", "8Q")
    assert placement(sim, 0) == "Not Applicable"
    assert nvml(sim).vgpu_placement_id(PF, vf(0)) == NVML_INVALID_VGPU_PLACEMENT_ID
    assert errno_of(move, sim, 0, 16) == errno.EINVAL
    assert code(nvml(sim).vgpu_type_creatable_placements, PF, int(num("L40S", "8Q"))) == NVML_ERROR_NOT_SUPPORTED
    sim.io.write(sim.env.pci(vf(0)) / "nvidia/current_vgpu_type", "0\n")
    assert not (sim.env.pci(vf(0)) / "nvidia/placement_id").exists()


def test_writing_placement_id_moves_to_a_creatable_placement_only(l40s, holder):
    set_type(l40s, 0, "L40S", "8Q")
    set_type(l40s, 1, "L40S", "8Q")
    assert (placement(l40s, 0), placement(l40s, 1)) == ("0", "16")
    assert errno_of(move, l40s, 0, 16) == errno.EINVAL  # held by the other one
    assert errno_of(move, l40s, 0, 8) == errno.EINVAL  # not an 8 GiB placement
    assert errno_of(move, l40s, 0, 0) == errno.EINVAL  # its own slots stay reserved until it moves
    move(l40s, 0, 40)
    assert placement(l40s, 0) == "40" and nvml(l40s).vgpu_placement_id(PF, vf(0)) == 40
    n = nvml(l40s)
    assert n.vgpu_type_creatable_placements(PF, int(num("L40S", "8Q"))) == (8, [0, 24])
    h = holder(l40s, l40s.env.vfio_group(l40s.host.state["functions"][vf(1)]["group"]))
    assert errno_of(move, l40s, 1, 0) == errno.EBUSY  # nothing in use moves
    h.release()
    move(l40s, 1, 0)
    assert placement(l40s, 1) == "0"


def test_creatable_placements_shrink_and_return_when_a_whole_range_frees(l40s):
    n = nvml(l40s)
    q24, q4, q6 = (int(num("L40S", s)) for s in ("24Q", "4Q", "6Q"))
    for i in range(8):
        set_type(l40s, i, "L40S", "4Q")  # 8 x 4Q: the most in mixed-size mode (12 in equal-size mode)
    assert [placement(l40s, i) for i in range(8)] == ["0", "8", "12", "20", "24", "32", "36", "44"]
    assert n.vgpu_type_creatable_placements(PF, q4) == (4, [])
    assert "L40S-4Q" not in creatable_types(l40s, 8)
    assert "L40S-2Q" in creatable_types(l40s, 8)  # slots 4-5 are free: 2 GiB fits at 4
    assert n.vgpu_type_creatable_placements(PF, q24) == (24, [])
    for i in range(4, 8):  # free 24-47 (the 4Q at 24, 32, 36, 44)
        l40s.io.write(l40s.env.pci(vf(i)) / "nvidia/current_vgpu_type", "0\n")
    assert n.vgpu_type_creatable_placements(PF, q24) == (24, [24])
    assert n.vgpu_type_creatable_placements(PF, q6) == (6, [24, 30, 36, 42])
    l40s.io.write(l40s.env.pci(vf(3)) / "nvidia/current_vgpu_type", "0\n")  # 20-23 free, 0-19 not
    assert n.vgpu_type_creatable_placements(PF, q24) == (24, [24])
    assert n.vgpu_type_creatable_placements(PF, q6) == (6, [18, 24, 30, 36, 42])


def test_one_gib_types_are_not_creatable_in_mixed_size_mode(l40s):
    assert {"L40S-1Q", "L40S-1B", "L40S-1A"}.isdisjoint(creatable_types(l40s, 0))
    assert {"L40S-2Q", "L40S-4Q", "L40S-48Q"} <= creatable_types(l40s, 0)
    assert nvml(l40s).vgpu_type_supported_placements(PF, int(num("L40S", "1Q"))) == (1, [])
    assert errno_of(set_type, l40s, 0, "L40S", "1Q") == errno.EINVAL  # not listed


def test_mdevs_on_vfs_get_placements_too(make_sim):
    sim = make_sim(one("A100-40GB", vfs_enabled=True, mixed_size=True))
    b = catalog.board("A100-40GB")
    t20 = next(t for t in b.types if t.short_name == "A100-20C").mdev_id()
    t10 = next(t for t in b.types if t.short_name == "A100-10C").mdev_id()
    u1, u2 = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    sim.io.write(sim.env.pci(vf(0)) / "mdev_supported_types" / t10 / "create", u1 + "\n")
    sim.io.write(sim.env.pci(vf(1)) / "mdev_supported_types" / t20 / "create", u2 + "\n")
    assert (sim.env.mdev_devices / u1 / "nvidia/placement_id").read_text() == "0\n"
    assert (sim.env.mdev_devices / u2 / "nvidia/placement_id").read_text() == "20\n"
    assert (sim.env.pci(vf(2)) / "mdev_supported_types" / t20 / "available_instances").read_text() == "0\n"
    assert (sim.env.pci(vf(2)) / "mdev_supported_types" / t10 / "available_instances").read_text() == "1\n"
    sim.io.write(sim.env.mdev_devices / u1 / "nvidia/placement_id", "10\n")
    assert nvml(sim).vgpu_placement_id(PF, u1) == 10
    assert nvml(sim).vgpu_type_creatable_placements(PF, int(t10.split("-")[1])) == (10, [0])
    sim.io.write(sim.env.mdev_devices / u2 / "remove", "1\n")
    assert nvml(sim).vgpu_type_creatable_placements(PF, int(t20.split("-")[1])) == (20, [20])


def test_mixed_size_mode_mixes_sizes_equal_size_mode_does_not(make_sim):
    sim = make_sim(one("L4", vfs_enabled=True))
    set_type(sim, 0, "L4", "L4-12C")
    assert creatable_types(sim, 1) == {"L4-12C", "L4-12Q"}  # equal-size mode: one size
    sim.io.write(sim.env.pci(vf(0)) / "nvidia/current_vgpu_type", "0\n")
    nvml(sim).set_vgpu_heterogeneous_mode(PF, 1)
    set_type(sim, 0, "L4", "L4-12C")
    assert creatable_types(sim, 1) == {f"L4-{n}{s}" for n in (2, 3, 4, 6, 8, 12) for s in "QC"} - {"L4-2C", "L4-3C"}
    set_type(sim, 1, "L4", "L4-8C")
    set_type(sim, 2, "L4", "L4-4C")
    assert [placement(sim, i) for i in range(3)] == ["0", "16", "12"]  # 8 GiB at 0 or 16; 4 GiB at 0, 8, 12, 20
    assert creatable_types(sim, 3) == set()  # every slot is held
