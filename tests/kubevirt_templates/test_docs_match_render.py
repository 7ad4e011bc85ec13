"""docs/dra-vms.md shows the claim template ``render`` writes, byte for byte (issue 29, item 10: it
showed a ``profile == "T4-1Q"`` selector render never wrote)."""

from __future__ import annotations

import re

from tests.support.simnodes import REPO
from vgpuctl.main import main


def test_the_docs_claim_template_is_renders(capsys):
    doc = (REPO / "docs/dra-vms.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "kind: ResourceClaimTemplate" in b]
    assert main(["render", "claim-template", "--set", "profile=T4-1Q"]) == 0
    out = capsys.readouterr().out
    assert out.removeprefix("---\n") == block


def test_no_doc_shows_a_selector_render_never_writes():
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert '].profile ==' not in md.read_text(), md
