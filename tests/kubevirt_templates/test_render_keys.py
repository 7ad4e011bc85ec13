"""``vgpuctl render -h`` reads its kinds and keys from a generated file (vgpuctl/cli/render_keys.py), so its
help loads neither pydantic nor the templates: that file must say what the models say."""

from __future__ import annotations

from pathlib import Path

from kubevirt_templates.keys import keys_help
from kubevirt_templates.render import ALIASES, KINDS
from kubevirt_templates.validate import ENV_SCHEMA
from vgpuctl.cli import render_keys


def test_the_generated_keys_are_the_models_keys():
    text = Path(render_keys.__file__).read_text()
    assert render_keys.generated() in text, "run: python -m vgpuctl.cli.render_keys (the models changed)"
    assert render_keys.KINDS == tuple(KINDS)
    assert render_keys.ALIASES == ALIASES
    assert render_keys.KEYS == {kind: keys_help(model) for kind, (model, _) in KINDS.items()}
    assert render_keys.ENV_SCHEMA == ENV_SCHEMA
