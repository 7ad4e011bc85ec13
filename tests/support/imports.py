"""Our modules' imports read from the source (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("vgpuctl", "mdev_manager", "dra_bridge", "kubevirt_templates")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    """Every module of the installed packages: dotted name -> file."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports(name: str, path: Path) -> set[str]:
    """Every dotted name ``name`` imports, at any depth of the file (functions included)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # ``from pkg import module``
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``pkg.module.attr`` counted as ``pkg.module``)."""
    modules = sources()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for m in imports(name, path):
            while m and m not in modules:
                m = m.rpartition(".")[0]
            if m and m != name and not name.startswith(m + "."):  # a module may use its own package
                targets.add(m)
        edges[name] = targets
    return edges


def reachable(*start: str) -> set[str]:
    """The modules loaded, at some point, by running ``start`` (their packages' ``__init__`` included)."""
    edges = graph()
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m in seen or m not in edges:
            continue
        seen.add(m)
        todo.extend(edges[m])
        parent = m.rpartition(".")[0]
        if parent:
            todo.append(parent)
    return seen
