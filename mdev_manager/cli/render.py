"""``vgpuctl render KIND [-f values.yaml] [--set key=value ...]``: print the objects as YAML.

Hook into the main parser with :func:`add_render_parser`::

    add_render_parser(sub)          # sub = the vgpuctl subparsers
    # ... args.func(args) runs cmd_render

``kubevirt-cr`` needs the GPU nodes' inventories: ``--inventory FILE`` (repeatable; the output
of ``vgpuctl discover -o yaml`` on each node), or the simulated host with ``--simulate``
(``vgpuctl --simulate render kubevirt-cr`` or ``vgpuctl render kubevirt-cr --simulate``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from kubevirt_templates.render import KINDS, RenderError, canonical_kind, render, render_yaml


def parse_set(assignments: list[str]) -> dict[str, Any]:
    """``a.b=v`` pairs as nested dicts; each value is read as YAML (``2``, ``true``, ``[a, b]``)."""
    out: dict[str, Any] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise RenderError(f"--set {item!r}: expected key=value (nested keys with dots: gpus.A100-4C=1)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise RenderError(f"--set {item!r}: the value is not valid YAML ({exc})") from None
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise RenderError(f"--set {item!r}: {p} was already given a value")
            node = nxt
        node[parts[-1]] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_values(files: list[str] | None, sets: list[str] | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in files or []:
        try:
            text = sys.stdin.read() if f == "-" else Path(f).read_text()
            doc = yaml.safe_load(text) or {}
        except OSError as exc:
            raise RenderError(f"values file {f}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise RenderError(f"values file {f}: not valid YAML ({exc})") from None
        if not isinstance(doc, dict):
            raise RenderError(f"values file {f}: expected a mapping of field: value")
        values = _merge(values, doc)
    return _merge(values, parse_set(sets or []))


def _inventory_from_file(path: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise RenderError(f"--inventory {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RenderError(f"--inventory {path}: not valid YAML/JSON ({exc})") from None
    if not isinstance(doc, dict) or "gpus" not in doc:
        raise RenderError(f"--inventory {path}: expected the output of `vgpuctl discover -o yaml`")
    return doc


def _simulated_inventory(args: argparse.Namespace) -> dict[str, Any]:
    from mdev_manager.cli.common import open_host
    from mdev_manager.discovery import discover
    from mdev_manager.sim import load_host

    defaults = {"sim_dir": None, "libvirt_uri": None, "sys_root": None, "dev_root": None,
                "mdevctl_root": None, "state_root": None}
    ns = argparse.Namespace(**{**defaults, **vars(args)})
    env, io = open_host(ns)
    inv = discover(env, io, node=load_host(ns.simulate).node)
    return inv.model_dump(mode="json")


def cmd_render(args: argparse.Namespace) -> int:
    try:
        kind = canonical_kind(args.kind)
        values = load_values(args.values, args.set)
        inventories = [_inventory_from_file(p) for p in args.inventory or []]
        if getattr(args, "simulate", None):
            inventories.append(_simulated_inventory(args))
        if inventories:
            if kind != "kubevirt-cr":
                raise RenderError("--inventory/--simulate: only kubevirt-cr is generated from inventories")
            values["inventories"] = list(values.get("inventories") or []) + inventories
        objects = render(kind, values)
    except RenderError as exc:
        print(f"error: cannot render {args.kind}:", file=sys.stderr)
        for p in exc.problems:
            print(f"  - {p}", file=sys.stderr)
        return 2
    sys.stdout.write(render_yaml(objects))
    return 0


def add_render_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``render`` to ``subparsers`` (the handler is :func:`cmd_render`, set as ``func``)."""
    kinds = ", ".join(KINDS)
    r = subparsers.add_parser(
        "render",
        help="print KubeVirt/DRA objects (VM, KubeVirt CR settings, DeviceClasses, claim templates, vfio Pod)",
        description=f"Render a template as YAML. Kinds: {kinds}. Values come from -f files and --set, "
        "validated before anything is printed.",
    )
    r.add_argument("kind", metavar="KIND", help=f"one of: {kinds}")
    r.add_argument("-f", "--values", action="append", metavar="FILE", help="values YAML (repeatable; - for stdin)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="set a value (YAML): --set mode=dra --set gpus.A100-4C=1 --set first_available=[A100-4C,T4-4C]")
    r.add_argument("--inventory", action="append", metavar="FILE",
                   help="kubevirt-cr: a node inventory (`vgpuctl discover -o yaml`); repeatable")
    r.add_argument("--simulate", nargs="?", const="default", default=argparse.SUPPRESS, metavar="PRESET",
                   help="kubevirt-cr: use the simulated host's inventory")
    r.set_defaults(func=cmd_render)
    return r


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m mdev_manager.cli.render``) until the main CLI hooks it."""
    p = argparse.ArgumentParser(prog="vgpuctl")
    p.add_argument("--simulate", nargs="?", const="default")
    p.add_argument("--sim-dir")
    sub = p.add_subparsers(dest="cmd", required=True)
    add_render_parser(sub)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
