"""The campaign's mutations (tests/campaign/mutations.py) still patch the code as it is: each patch's
text is in its file exactly once, so a refactor cannot silently turn a mutation into a no-op or a
crash of the mutation run (found when a typing change moved the overlap check's first line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.campaign.mutations import MUTATIONS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mutation", [m for m in MUTATIONS if m.patches], ids=lambda m: m.key)
def test_each_mutation_patches_the_code_once(mutation):
    for p in mutation.patches:
        text = (ROOT / p.path).read_text()
        assert text.count(p.old) == 1, f"mutation ({mutation.key}): {p.path} holds its text {text.count(p.old)} times"
        assert p.new != p.old


def test_every_rule_the_issue_names_has_a_mutation():
    assert [m.key for m in MUTATIONS] == list("abcdefghij") + list("klmn") + list("tuv")  # #36.5, #40.4, #36.2
