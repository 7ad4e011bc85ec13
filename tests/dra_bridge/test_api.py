"""dra_bridge.api: the published vocabulary (names, Kubernetes name rules, quantities), one of each."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import pytest

from dra_bridge.api import names
from dra_bridge.api.k8sname import (
    MAX_STRING_ATTR,
    dns_safe,
    fit_dns_label,
    is_dns_label,
    is_dns_subdomain,
    short_hash,
    truncate_utf8,
)
from dra_bridge.api.quantity import format_quantity, parse_quantity
from mdev_manager.models import VgpuType

# --------------------------------------------------------------------------- quantities


@pytest.mark.parametrize("text, value", [
    ("1536Mi", 1536 * 2**20), ("1.5Gi", 1536 * 2**20), ("16", 16), ("2k", 2000), ("500m", Fraction(1, 2)),
    ("1e3", 1000), ("1E3", 1000), ("1e-3", Fraction(1, 1000)), ("1E+3", 1000), ("1E", 10**18),  # E alone: exa
    ("5.", 5), (".5", Fraction(1, 2)), ("+.5", Fraction(1, 2)), ("-1.5Gi", -1536 * 2**20), ("1.G", 10**9),
    ("0", 0), ("3n", Fraction(3, 10**9)), ("7u", Fraction(7, 10**6)),
])
def test_quantity_grammar(text, value):
    assert parse_quantity(text) == value


# The two parsers this one replaces disagreed here: dra_bridge/api/quantity.py took an exponent
# together with a suffix ("1e3Ki" = 1024000) and handed malformed numbers ("1.2.3", ".") to
# Fraction, whose error did not say "quantity"; dra_bridge/pool/devices.py refused them as the
# API server does (resource.ParseQuantity: one suffix, an integer exponent).
@pytest.mark.parametrize("text", ["1e3Ki", "2E3M", "1e3k", "1.2.3", ".", "1..5", "1e1.5", "e3", "1e", "Ki",
                                  "", "-", "1K", "1 Gi", " 1Gi", "1Gi ", "12 apples", "0x10", "1_000"])
def test_quantity_refuses_what_the_api_server_refuses(text):
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        parse_quantity(text)


def test_quantity_rounds_and_caps_as_the_api_server():
    """Finer than 1n rounds away from zero (0.9n is 1n); binary SI caps at 2^63-1 (8Ei)."""
    assert parse_quantity("0.9n") == parse_quantity("1n") == Fraction(1, 10**9)
    assert parse_quantity("-0.1n") == -Fraction(1, 10**9)
    assert parse_quantity("1e-12") == Fraction(1, 10**9)
    assert parse_quantity("8Ei") == parse_quantity("9Ei") == 2**63 - 1
    assert parse_quantity("9E") == 9 * 10**18  # decimal SI is not capped


def test_quantity_numbers_pass_through():
    assert parse_quantity(3) == 3
    assert parse_quantity(Fraction(1, 3)) == Fraction(1, 3)
    assert format_quantity(parse_quantity("1.5Gi")) == "1536Mi"
    assert format_quantity(parse_quantity("1500m")) == "1500m"


def test_one_parser():
    """The modules that had their own parser use this one."""
    from dra_bridge.pool import devices, slices

    assert devices.parse_quantity is parse_quantity
    assert slices.parse_quantity is parse_quantity


# --------------------------------------------------------------------------- Kubernetes names


def test_dns_names():
    assert is_dns_label("gpu-0-vgpu-t4-1q-0") and not is_dns_label("Gpu") and not is_dns_label("a" * 64)
    assert is_dns_label("a" * 63) and not is_dns_label("-a") and not is_dns_label("a.b")
    assert is_dns_subdomain("vgpu.kubevirt.io") and not is_dns_subdomain("vgpu..io") and not is_dns_subdomain("a" * 254)
    assert dns_safe("NVIDIA A100-4C") == "nvidia-a100-4c" and dns_safe("--x__y--") == "x-y"


def test_fit_dns_label_cuts_and_stays_unique():
    a = fit_dns_label("gpu-0-vgpu-", "x" * 80, "-0")
    b = fit_dns_label("gpu-0-vgpu-", "x" * 79 + "y", "-0")
    assert len(a) == 63 and is_dns_label(a) and a != b and a.endswith(short_hash("x" * 80) + "-0")
    assert fit_dns_label("p-", "!!!", "") == "p-x"
    with pytest.raises(ValueError):
        fit_dns_label("p" * 60, "middle", "s" * 10)


def test_truncate_utf8_counts_bytes():
    assert truncate_utf8("Ω" * 40) == "Ω" * 32 and len(truncate_utf8("Ω" * 40).encode()) == MAX_STRING_ATTR
    assert truncate_utf8("a\x00b") == "ab"


# --------------------------------------------------------------------------- the driver's names


def test_one_driver_name():
    import kubevirt_templates
    from dra_bridge.api import nodepaths
    from dra_bridge.pool import devices

    assert names.DEFAULT_DRIVER == "vgpu.kubevirt.io"
    assert nodepaths.DEFAULT_DRIVER is devices.DEFAULT_DRIVER is kubevirt_templates.DRIVER is names.DEFAULT_DRIVER
    assert nodepaths.NodePaths().driver == names.DEFAULT_DRIVER


def test_device_and_counter_names():
    assert names.counter_set_name(2) == "gpu-2-counter-set"
    assert names.passthrough_device_name(0) == "gpu-0-passthrough"
    assert names.vgpu_device_name(1, "a100-4c", 3) == "gpu-1-vgpu-a100-4c-3"
    assert is_dns_label(names.vgpu_device_name(1, "x" * 90, 31))
    assert names.compatibility_group(4096) == "fb-4096"
    assert names.profile_of("NVIDIA A100-4C") == "A100-4C" and names.profile_of("GVTg_V5_4") == "GVTg_V5_4"


def test_type_is_mig_backed():
    def t(name: str, mig: bool = False) -> VgpuType:
        return VgpuType(id="nvidia-1", name=name, short_name=name.split()[-1], framework="mdev", mig_backed=mig)

    assert names.type_is_mig_backed(t("NVIDIA A100-1-5C"))  # by the name grammar
    assert names.type_is_mig_backed(t("NVIDIA X-odd", mig=True))  # by what the driver says
    assert not names.type_is_mig_backed(t("NVIDIA A100-4C"))


def test_classic_resource_names():
    assert names.resource_name_for_type("GRID T4-1Q") == "nvidia.com/GRID_T4-1Q"
    assert names.resource_name_for_pci("TU104GL [Tesla T4]") == "nvidia.com/TU104GL_TESLA_T4"
    assert names.resource_name_for_pci(None, "gpu.example.org/", "0x1EB8") == "gpu.example.org/1eb8"
    assert names.resource_env_var("nvidia.com/GRID_T4-1Q", "mdev") == "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q"
    assert names.check_resource_name("nvidia.com/" + "A" * 63)
    for bad in ("nvidia.com/" + "A" * 64, "nvidia.com/_x", "noslash", "Bad_Domain/x"):
        with pytest.raises(ValueError):
            names.check_resource_name(bad)
    for bad in ("kubernetes.io", "x.k8s.io/", "", "Upper.com"):
        with pytest.raises(ValueError):
            names.normalize_prefix(bad)


def test_labels_are_the_slices_labels():
    from dra_bridge.pool.devices import PoolPolicy, build_pool
    from dra_bridge.pool.slices import build_slices
    from tests.dra_bridge.test_devices import inventory, t4

    pool = build_pool(inventory(t4()), PoolPolicy.default(), server_version=(1, 35))
    slices = build_slices(pool, driver=names.DEFAULT_DRIVER, node_name="node-a", pool_name="node-a",
                          generation=1, server_version=(1, 35))
    assert {s["metadata"]["labels"][names.LABEL_ROLE] for s in slices} == {"counters", "devices"}
    for s in slices:
        labels = s["metadata"]["labels"]
        assert labels[names.LABEL_DRIVER] == names.DEFAULT_DRIVER and labels[names.LABEL_NODE] == "node-a"
        assert labels[names.LABEL_POOL] == "node-a" and labels[names.LABEL_MANAGED_BY] == names.MANAGED_BY


def test_the_vocabulary_is_pure():
    """Importing the vocabulary loads no transport and none of the driver's other packages."""
    code = (
        "import sys\n"
        "import dra_bridge.api.names, dra_bridge.api.k8sname, dra_bridge.api.quantity\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'kubernetes', 'jinja2')\n"
        "       or m.startswith(('dra_bridge.pool', 'dra_bridge.apiclient', 'dra_bridge.deviceplugin', 'mdev_manager.host'))]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
