"""Kubernetes objects checked against the strict upstream schemas of ``kubernetes-validate``
(a test dependency)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kubernetes_validate


def kubernetes_problems(obj: Mapping[str, Any], versions: tuple[str, ...] = ("1.34", "1.35", "1.36", "1.37")) -> list[str]:
    """Problems with a Kubernetes object under the strict schemas of ``kubernetes-validate``."""
    problems = []
    for version in versions:
        try:
            kubernetes_validate.validate(dict(obj), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path) or "(root)"
            problems.append(f"{obj.get('kind')} {where} (Kubernetes {version}): {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{obj.get('kind')} (Kubernetes {version}): {exc.message}")
    return problems
