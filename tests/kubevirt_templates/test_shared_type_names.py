"""A short name two boards share (#38.4): ``DC-2-16Q`` is an RTX PRO 6000 and an RTX PRO 4500
Server Edition type, and the device plugin names each board's resource after its own full name
(``nvidia.com/NVIDIA_RTX_Pro_6000_Blackwell_DC-2-16Q``, ``..._RTX_PRO_4500_...``). Where a render
names a resource (classic VMs, DeviceClasses with extended resources), the node's inventory
(``--inventory``, ``--simulate``) tells which board's type is meant, by the PCI device id of its
GPUs; with no inventory such a name is refused in one line naming both boards and the fix. No
preset has a 4500: its inventory is written by the simulated host's discovery.
"""

from __future__ import annotations

import pytest

from kubevirt_templates.render import RenderError, render
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from vgpuctl.main import main

R6000 = "nvidia.com/NVIDIA_RTX_Pro_6000_Blackwell_DC-2-16Q"
R4500 = "nvidia.com/NVIDIA_RTX_PRO_4500_Blackwell_DC-2-16Q"


@pytest.fixture
def simdir(tmp_path, monkeypatch):
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path / "sims"))
    return tmp_path / "sims"


def inventory(make_sim, tmp_path, *boards: str) -> str:
    """``vgpuctl discover -o json`` of a host with these boards, as a file."""
    sim = make_sim(HostSpec(name="h", node="h", gpus=[GpuGroup(board=b, vfs_enabled=True) for b in boards]))
    path = tmp_path / f"inventory-{'-'.join(boards)}.json"
    path.write_text(sim.discover().model_dump_json())
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def extended(out: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("  extendedResourceName: ")
            and "vfio-device" not in line]


def test_the_issues_command_renders_the_6000s_resource(simdir, capsys):
    """The rtxpro-node preset has RTX PRO 6000s only: its DC-2-16Q class maps to the 6000's
    resource and selects the 6000's devices (PCI device 0x2bb5)."""
    code, out, err = run(capsys, "--simulate", "rtxpro-node", "render", "deviceclasses",
                         "--set", "extended_resources=true", "--set", "profiles=[DC-2-16Q]")
    assert code == 0, err
    assert extended(out) == [R6000]
    assert 'deviceId == "0x2bb5"' in out and "vgpuType: DC-2-16Q" in out and "name: vgpu-dc-2-16q" in out


def test_a_4500_nodes_inventory_renders_the_4500s_resource(make_sim, tmp_path, simdir, capsys):
    inv = inventory(make_sim, tmp_path, "RTX-PRO-4500-BSE")
    code, out, err = run(capsys, "render", "deviceclasses", "--inventory", inv,
                         "--set", "extended_resources=true", "--set", "profiles=[dc-2-16q]")
    assert code == 0, err
    assert extended(out) == [R4500] and 'deviceId == "0x2c3a"' in out
    code, out, err = run(capsys, "render", "vm", "--inventory", inv, "--set", "name=vm1", "--set", "gpus.DC-2-16Q=2")
    assert code == 0, err
    assert out.count(f"deviceName: {R4500}") == 2
    code, out, err = run(capsys, "--simulate", "rtxpro-node", "render", "vm", "--set", "name=vm1",
                         "--set", "gpus.DC-2-16Q=1")
    assert code == 0 and out.count(f"deviceName: {R6000}") == 1, err


@pytest.mark.parametrize("argv, key", [
    (["deviceclasses", "--set", "extended_resources=true", "--set", "profiles=[DC-2-16Q]"], "profiles.DC-2-16Q"),
    (["vm", "--set", "name=vm1", "--set", "gpus.DC-2-16Q=1"], "gpus.DC-2-16Q"),
])
def test_without_an_inventory_a_shared_name_is_refused_in_one_line(capsys, argv, key):
    code, out, err = run(capsys, "render", *argv)
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.count("\n") == 1, err
    assert f"error: cannot render {argv[0]}: {key}: DC-2-16Q is a vGPU type of RTX-PRO-6000-BSE (PCI device 0x2bb5) " \
           "and of RTX-PRO-4500-BSE (PCI device 0x2c3a) in vgpuctl's catalog" in err, err
    assert "'NVIDIA RTX Pro 6000 Blackwell DC-2-16Q' or 'NVIDIA RTX PRO 4500 Blackwell DC-2-16Q'" in err
    assert "give the node's inventory (--inventory FILE or --simulate)" in err


def test_the_drivers_full_name_needs_no_inventory(capsys):
    code, out, err = run(capsys, "render", "deviceclasses", "--set", "extended_resources=true",
                         "--set", "profiles=[NVIDIA RTX PRO 4500 Blackwell DC-2-16Q]")
    assert code == 0, err
    assert extended(out) == [R4500] and 'deviceId == "0x2c3a"' in out and "name: vgpu-dc-2-16q" in out
    code, out, err = run(capsys, "render", "vm", "--set", "name=vm1",
                         "--set", "gpus.NVIDIA RTX Pro 6000 Blackwell DC-2-16Q=1")
    assert code == 0 and f"deviceName: {R6000}" in out, err
    # two boards' names for one class: one DeviceClass maps to one resource
    code, out, err = run(capsys, "render", "deviceclasses", "--set", "extended_resources=true", "--set",
                         "profiles=[NVIDIA RTX PRO 4500 Blackwell DC-2-16Q, NVIDIA RTX Pro 6000 Blackwell DC-2-16Q]")
    assert code == 2 and err.count("\n") == 1 and "are both DC-2-16Q" in err, err


def test_a_node_with_both_boards_asks_for_the_full_name(make_sim, tmp_path, capsys):
    inv = inventory(make_sim, tmp_path, "RTX-PRO-6000-BSE", "RTX-PRO-4500-BSE")
    code, out, err = run(capsys, "render", "deviceclasses", "--inventory", inv,
                         "--set", "extended_resources=true", "--set", "profiles=[DC-2-16Q]")
    assert code == 2 and err.count("\n") == 1, err
    assert "DC-2-16Q is a vGPU type of GB202GL [RTX PRO 6000 Blackwell Server Edition] (PCI device 0x2bb5) and of " \
           "GB203 [RTX PRO 4500 Blackwell Server Edition] (PCI device 0x2c3a) on the given nodes" in err, err
    assert "--inventory FILE" not in err  # it was given
    code, out, err = run(capsys, "render", "deviceclasses", "--inventory", inv, "--set", "extended_resources=true",
                         "--set", "profiles=[NVIDIA RTX PRO 4500 Blackwell DC-2-16Q]")
    assert code == 0 and extended(out) == [R4500] and 'deviceId == "0x2c3a"' in out, err
    code, out, err = run(capsys, "render", "claim-template", "--inventory", inv, "--set", "profile=DC-2-16Q")
    assert code == 0, err  # a claim names no resource: either board's DC-2-16Q


@pytest.mark.parametrize("name, resource", [("T4-1Q", "nvidia.com/GRID_T4-1Q"), ("A100-4C", "nvidia.com/NVIDIA_A100-4C"),
                                            ("DC-1-24Q", "nvidia.com/NVIDIA_RTX_Pro_6000_Blackwell_DC-1-24Q")])
def test_a_name_one_board_has_needs_no_inventory(capsys, name, resource):
    """DC-1-24Q is the 6000's alone (the 4500's instances are 16 GiB)."""
    code, out, err = run(capsys, "render", "vm", "--set", "name=vm1", "--set", f"gpus.{name}=1")
    assert code == 0 and f"deviceName: {resource}" in out, err
    code, out, err = run(capsys, "render", "deviceclasses", "--set", "extended_resources=true",
                         "--set", f"profiles=[{name}]")
    assert code == 0 and extended(out) == [resource] and "deviceId" not in out, err


def test_the_python_api_refuses_it_too():
    with pytest.raises(RenderError, match=r"gpus\.DC-8C: DC-8C is a vGPU type of RTX-PRO-6000-BSE"):
        render("vm", {"name": "vm1", "gpus": {"DC-8C": 1}})
    assert render("vm", {"name": "vm1", "mode": "dra", "gpus": {"DC-8C": 1}})  # claims name no resource


def test_a_gpu_instance_profile_is_the_boards_not_the_names_grammar(make_sim, tmp_path, simdir, capsys):
    """DC-2-16Q is a 16 GiB vGPU on the 6000's 2g.48gb instance and on the 4500's 2g.32gb one: no GPU
    has a 2g.16gb instance (what the name's grammar says), so no claim may select one."""
    inv = inventory(make_sim, tmp_path, "RTX-PRO-4500-BSE")
    cases = [(["--simulate", "rtxpro-node"], "2g.48gb", "2g.32gb"), (["--inventory", inv], "2g.32gb", "2g.48gb"),
             ([], "2g.32gb", "")]  # the catalog: both boards' instances
    for where, good, bad in cases:
        code, out, err = run(capsys, "render", "claim-template", *where, "--set", f"profile={good}")
        assert code == 0 and f'profile == "{good}"' in out, (where, err)
        for wrong in filter(None, ("2g.16gb", bad)):
            code, out, err = run(capsys, "render", "claim-template", *where, "--set", f"profile={wrong}")
            assert code == 2 and f"profile: '{wrong}' is not a vGPU type" in err, (where, wrong, out)
