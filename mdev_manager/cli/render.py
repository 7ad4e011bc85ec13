"""``vgpuctl render KIND [-f values.yaml] [--set key=value ...]``: print the objects as YAML.

KubeVirt objects are validated before anything is printed: against the cluster's own schema
with ``--kubeconfig`` (``/openapi/v3/apis/kubevirt.io/v1``: the KubeVirt release that will
receive them), against a file with ``--schema FILE`` or ``$VGPUCTL_KUBEVIRT_OPENAPI``; with
neither, stderr says that they were not validated.

``kubevirt-cr`` needs the GPU nodes' inventories: ``--inventory FILE`` (repeatable; the output
of ``vgpuctl discover -o yaml`` on each node), or the simulated host with ``--simulate``
(``vgpuctl --simulate render kubevirt-cr`` or ``vgpuctl render kubevirt-cr --simulate``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kubevirt_templates.render import KINDS, RenderError, canonical_kind, render, render_yaml
from kubevirt_templates.validate import ENV_SCHEMA, KubeVirtSchema, is_kubevirt, load_schema
from mdev_manager.yamlfile import YamlFileError, load_yaml, parse_yaml


def parse_set(assignments: list[str]) -> dict[str, Any]:
    """``a.b=v`` pairs as nested dicts; each value is read as YAML (``2``, ``true``, ``[a, b]``)."""
    out: dict[str, Any] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise RenderError(f"--set {item!r}: expected key=value (nested keys with dots: gpus.A100-4C=1)")
        try:
            value = parse_yaml(raw, name=f"--set {key.strip()}", what="value") if raw.strip() else ""
        except YamlFileError as exc:
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
            doc = load_yaml(f, what="values file") or {}
        except YamlFileError as exc:
            raise RenderError(f"values file {exc}") from None
        if not isinstance(doc, dict):
            raise RenderError(f"values file {f}: expected a mapping of field: value")
        values = _merge(values, doc)
    return _merge(values, parse_set(sets or []))


def _inventory_from_file(path: str) -> dict[str, Any]:
    try:
        doc = load_yaml(path, what="node inventory", json_first=True)
    except YamlFileError as exc:
        raise RenderError(f"--inventory {exc}") from None
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


class SchemaUnavailable(Exception):
    """The schema that was asked for could not be read."""


def kubevirt_schema(args: argparse.Namespace) -> KubeVirtSchema | None:
    """The schema to validate against: the cluster's, a file's, or None (not asked for)."""
    kubeconfig = getattr(args, "kubeconfig", None)
    if kubeconfig:
        from dra_bridge.kube.client import KubeconfigError, api_client_from
        from dra_bridge.kube.openapi import KUBEVIRT_V1, OpenApiUnavailable, fetch_kubevirt_openapi

        try:
            api = api_client_from(kubeconfig)
        except KubeconfigError as exc:
            raise SchemaUnavailable(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - kubernetes.config raises several types
            raise SchemaUnavailable(f"--kubeconfig {kubeconfig}: {exc}") from None
        try:
            doc = fetch_kubevirt_openapi(api)
        except OpenApiUnavailable as exc:
            raise SchemaUnavailable(f"cannot read KubeVirt's schema from the cluster: {exc}") from None
        finally:
            api.close()
        try:
            return KubeVirtSchema(doc, source=f"the cluster's {KUBEVIRT_V1}")
        except ValueError as exc:
            raise SchemaUnavailable(str(exc)) from None
    path = getattr(args, "schema", None) or os.environ.get(ENV_SCHEMA)
    if not path:
        return None
    try:
        return load_schema(path)
    except (OSError, ValueError) as exc:
        raise SchemaUnavailable(f"KubeVirt schema {path}: {exc}") from None


def _check_kubevirt(args: argparse.Namespace, objects: list[dict[str, Any]]) -> int:
    """0 when the KubeVirt objects validate (or validation was not asked for), 1 when they do not,
    2 when the schema asked for cannot be had (bad input, as for any unreadable file)."""
    kubevirt = [o for o in objects if is_kubevirt(o)]
    if not kubevirt:
        return 0
    try:
        schema = kubevirt_schema(args)
    except SchemaUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if schema is None:
        print("note: the KubeVirt objects were NOT validated against KubeVirt's schema "
              f"(give --kubeconfig to use the cluster's, or --schema FILE / ${ENV_SCHEMA})", file=sys.stderr)
        return 0
    status = 0
    for o in kubevirt:
        problems = schema.problems(o)
        if problems:
            status = 1
            name = (o.get("metadata") or {}).get("name", "")
            print(f"error: {o.get('kind')} {name} does not validate against {schema.source}:", file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
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
        if len(exc.problems) == 1:
            print(f"error: cannot render {args.kind}: {exc.problems[0]}", file=sys.stderr)
        else:
            print(f"error: cannot render {args.kind}:", file=sys.stderr)
            for p in exc.problems:
                print(f"  - {p}", file=sys.stderr)
        return 2
    status = _check_kubevirt(args, objects)
    if status:
        return status
    sys.stdout.write(render_yaml(objects))
    return 0


def add_arguments(r: argparse.ArgumentParser) -> None:
    """The ``render`` arguments (the main CLI sets ``func`` to :func:`run`)."""
    kinds = ", ".join(KINDS)
    r.description = (f"Render a template as YAML. Kinds: {kinds}. Values come from -f files and --set, "
                     "validated before anything is printed; KubeVirt objects also against KubeVirt's schema "
                     "(--kubeconfig: the cluster's; --schema or $" + ENV_SCHEMA + ": a file).")
    r.add_argument("kind", metavar="KIND", help=f"one of: {kinds}")
    r.add_argument("-f", "--values", action="append", metavar="FILE", help="values YAML (repeatable; - for stdin)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="set a value (YAML): --set mode=dra --set gpus.A100-4C=1 --set first_available=[A100-4C,T4-4C]")
    r.add_argument("--inventory", action="append", metavar="FILE",
                   help="kubevirt-cr: a node inventory (`vgpuctl discover -o yaml`); repeatable")
    r.add_argument("--simulate", nargs="?", const="default", default=argparse.SUPPRESS, metavar="PRESET",
                   help="kubevirt-cr: use the simulated host's inventory")
    schema = r.add_mutually_exclusive_group()
    schema.add_argument("--kubeconfig", metavar="FILE",
                        help="validate KubeVirt objects against this cluster's schema (/openapi/v3/apis/kubevirt.io/v1)")
    schema.add_argument("--schema", metavar="FILE",
                        help=f"validate KubeVirt objects against this OpenAPI file (default ${ENV_SCHEMA}); "
                        "KubeVirt's api/openapi-spec/swagger.json or an OpenAPI v3 document")


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m mdev_manager.cli.render``)."""
    p = argparse.ArgumentParser(prog="vgpuctl")
    p.add_argument("--simulate", nargs="?", const="default")
    p.add_argument("--sim-dir")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    add_arguments(r)
    r.set_defaults(func=run)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
