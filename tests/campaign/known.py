"""Bugs the campaign finds in the code as it is, each with the violation it shows and a fix.

The campaign itself fails on them (``python -m tests.campaign`` exits 1: a violation is never only
logged). Two places use this table until each fix lands:

* ``tests/system/test_campaign.py`` marks a run as an expected failure (``xfail``, naming the
  bug) when *every* violation of its failing step is one of these; any other violation fails it;
* ``python -m tests.campaign.mutations`` applies each fix to its scratch copy (never to this
  checkout), so the mutations are measured against a campaign that passes.

A fix whose text is no longer in the code has landed, or the code moved: the mutations script
says so, and the entry should go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Known:
    what: str
    shows: re.Pattern  # matches each violation line it causes
    fix: tuple[Patch, ...]


#: Empty: the three bugs the campaign found (KEP-5304 metadata removed by claim name, a dra GPU held on
#: vfio-pci reported as matching, a MIG layout refused for a passed-through GPU) are fixed in the code,
#: each with a test of its own (tests/dra_bridge/test_claim_recreated.py, tests/mdev_manager/test_plan.py,
#: tests/mdev_manager/test_mig.py); mutation (i) of tests/campaign/mutations.py breaks the first again.
KNOWN: dict[str, Known] = {}


def violations(failure: str) -> list[str]:
    """The violation lines of a campaign failure (between its first line and "what the step saw")."""
    lines = failure.split("\n  what the step saw:")[0].splitlines()[1:]
    return [ln.strip() for ln in lines if ln.strip()]


def which(failure: str) -> list[str]:
    """The known bugs that explain every violation of ``failure``; empty when one is not known."""
    found = []
    for line in violations(failure):
        keys = [k for k, b in KNOWN.items() if b.shows.search(line)]
        if not keys:
            return []
        found += [k for k in keys if k not in found]
    return found
