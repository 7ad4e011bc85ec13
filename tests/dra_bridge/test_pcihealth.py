"""The decision on a passed-through GPU's kernel readings (dra_bridge.pool.pcihealth), in the kernel's own formats."""

from __future__ import annotations

from dra_bridge.pool.pcihealth import PciReading, aer_counts, link_speed, pci_problems

# aer_dev_fatal as Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats shows it (abridged)
FATAL = "Undefined 0\nData Link Protocol 0\nSurprise Down Error 0\nCompletion Timeout {n}\nTOTAL_ERR_FATAL {n}\n"
HEAD = bytes.fromhex("de10b81e")


def reading(**kw) -> PciReading:
    base = dict(config=HEAD, aer_dev_fatal=FATAL.format(n=0), aer_dev_nonfatal=FATAL.format(n=0).replace("FATAL", "NONFATAL"),
                current_link_speed="16.0 GT/s PCIe", current_link_width="16", max_link_speed="16.0 GT/s PCIe",
                max_link_width="16", reset_method="flr bus")
    return PciReading(**{**base, **kw})


def kinds(problems) -> list[tuple[str, str | None]]:
    return [(p.kind, p.value) for p in problems]


def test_formats():
    assert aer_counts(FATAL.format(n=3)) == {"Undefined": 0, "Data Link Protocol": 0, "Surprise Down Error": 0,
                                             "Completion Timeout": 3, "TOTAL_ERR_FATAL": 3}
    assert aer_counts("") is None and aer_counts(None) is None
    assert link_speed("32.0 GT/s PCIe\n") == 32.0 and link_speed("8 GT/s\n") == 8.0  # newer and older kernels
    assert link_speed("Unknown\n") == 0.0 and link_speed("Unknown speed\n") == 0.0 and link_speed(None) is None


def test_aer_counters_growing_since_the_last_read_are_an_event():
    found, seen = pci_problems(reading(), None)
    assert found == []
    found, seen = pci_problems(reading(aer_dev_fatal=FATAL.format(n=5)), seen)
    assert kinds(found) == [("aer", "fatal")] and "Completion Timeout +5" in found[0].detail
    found, seen = pci_problems(reading(aer_dev_fatal=FATAL.format(n=6)), seen)
    assert kinds(found) == [("aer", "fatal")] and "Completion Timeout +1" in found[0].detail
    found, seen = pci_problems(reading(aer_dev_fatal=FATAL.format(n=6)), seen)
    assert found == []  # no new error: the tracker's quiet period runs


def test_config_all_ones_is_a_lost_gpu_and_nothing_else_is_judged_from_that_read():
    _, seen = pci_problems(reading(), None)
    found, after = pci_problems(reading(config=b"\xff" * 4, current_link_speed="Unknown", current_link_width="63",
                                        aer_dev_fatal=FATAL.format(n=9)), seen)
    assert kinds(found) == [("gpu-lost", None)] and after == seen


def test_a_narrower_link_than_at_the_first_read_is_a_fault_a_slower_one_is_not():
    _, seen = pci_problems(reading(current_link_width="8"), None)  # a x16 card in a x8 slot: its normal
    assert pci_problems(reading(current_link_width="8"), seen)[0] == []
    found, _ = pci_problems(reading(current_link_width="4"), seen)
    assert kinds(found) == [("pci-link", None)] and "x4 from x8" in found[0].detail
    # NVIDIA's driver lowers the speed at idle itself: not a fault; a link down is
    assert pci_problems(reading(current_link_width="8", current_link_speed="2.5 GT/s PCIe"), seen)[0] == []
    assert kinds(pci_problems(reading(current_link_width="8", current_link_speed="Unknown"), seen)[0]) == \
        [("pci-link", None)]


def test_reset_methods_gone_is_a_fault_none_from_the_start_is_the_board():
    _, seen = pci_problems(reading(), None)
    assert kinds(pci_problems(reading(reset_method=""), seen)[0]) == [("pci-reset", None)]
    _, bare = pci_problems(reading(reset_method=""), None)
    assert pci_problems(reading(reset_method=""), bare)[0] == []
    _, old = pci_problems(reading(reset_method=None), None)  # before Linux 5.15: no such file, nothing judged
    assert pci_problems(reading(reset_method=None), old)[0] == []


def test_nothing_readable_is_unmonitored_and_one_file_is_enough_to_watch():
    assert kinds(pci_problems(PciReading(), None)[0]) == [("unmonitored", None)]
    assert pci_problems(PciReading(config=HEAD), None)[0] == []


def test_counters_already_non_zero_at_the_first_read_are_reported_once():
    """They count from boot, not from the bind: an error nobody has reported (issue: newcomer item 3)."""
    found, seen = pci_problems(reading(aer_dev_fatal=FATAL.format(n=2)), None)
    assert kinds(found) == [("aer", "fatal")]
    assert "found at the watch's first look (Completion Timeout 2)" in found[0].detail
    assert pci_problems(reading(aer_dev_fatal=FATAL.format(n=2)), seen)[0] == []  # not growing: the quiet period runs
    found, _ = pci_problems(reading(aer_dev_nonfatal=FATAL.format(n=1).replace("FATAL", "NONFATAL")), None)
    assert kinds(found) == [("aer", "nonfatal")]
    assert pci_problems(reading(), None)[0] == []  # all zero: nothing happened
    _, unread = pci_problems(reading(aer_dev_fatal=None, aer_dev_nonfatal=None), None)  # no AER files yet
    assert kinds(pci_problems(reading(aer_dev_fatal=FATAL.format(n=1)), unread)[0]) == [("aer", "fatal")]
