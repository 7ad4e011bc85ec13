"""``vgpuctl render KIND [-f values.yaml] [--set key=value ...]``: print the objects as YAML.

Each kind is a subcommand whose ``-h`` lists its ``--set`` keys, read off the kind's typed input
(:mod:`kubevirt_templates.keys`), so the help says what the template accepts. vGPU types the
values name are matched, case-insensitively, against the node's types (``--simulate``,
``--inventory``) or else vgpuctl's catalog, and written as those spell them; an unknown one is
refused with the closest names (:mod:`kubevirt_templates.profiles`).

KubeVirt objects are checked before anything is printed: always against the admission rule the
templates could break (one vGPU display with ramfb), and against the cluster's own schema with
``--kubeconfig`` (``/openapi/v3/apis/kubevirt.io/v1``: the KubeVirt release that will receive
them), against a file with ``--schema FILE`` or ``$VGPUCTL_KUBEVIRT_OPENAPI``; with neither,
stderr says that they were not validated against a schema.

``kubevirt-cr`` needs the GPU nodes' inventories: ``--inventory FILE`` (repeatable; the output
of ``vgpuctl discover -o yaml`` on each node), or the simulated host with ``--simulate``
(``vgpuctl --simulate render kubevirt-cr`` or ``vgpuctl render kubevirt-cr --simulate``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from kubevirt_templates.profiles import KnownTypes
    from kubevirt_templates.validate import KubeVirtSchema


def parse_set(assignments: list[str]) -> dict[str, Any]:
    """``a.b=v`` pairs as nested dicts; each value is read as YAML (``2``, ``true``, ``[a, b]``)."""
    from kubevirt_templates.render import RenderError
    from mdev_manager.yamlfile import YamlFileError, parse_yaml

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
    from kubevirt_templates.render import RenderError
    from mdev_manager.yamlfile import YamlFileError, load_yaml

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
    from kubevirt_templates.render import RenderError
    from mdev_manager.yamlfile import YamlFileError, load_yaml

    try:
        doc = load_yaml(path, what="node inventory", json_first=True)
    except YamlFileError as exc:
        raise RenderError(f"--inventory {exc}") from None
    if not isinstance(doc, dict) or "gpus" not in doc:
        raise RenderError(f"--inventory {path}: expected the output of `vgpuctl discover -o yaml`")
    return doc


def _simulated_inventory(args: argparse.Namespace) -> dict[str, Any]:
    """The simulated host's inventory (``main`` opened it for ``--simulate``, before or after the kind)."""
    # start-up cost (~45 ms): only with --simulate
    from mdev_manager.discovery import discover
    from vgpuctl.cli.host import open_host

    host = open_host(args)
    return discover(host.env, host.io, node=host.node).model_dump(mode="json")


def catalog_types() -> KnownTypes:
    """Every vGPU type of vgpuctl's catalog (the boards it knows)."""
    from kubevirt_templates.profiles import KnownTypes
    from mdev_manager import catalog

    types, instances = [], []
    for b in catalog.BOARDS.values():
        for t in b.types:  # MIG-backed ones too: a GPU in MIG mode offers them at its placements
            types.append((str(t.num) if b.framework == "vendor-vfio" else t.mdev_id(b.driver), t.name))
            if t.gi_profile:
                instances.append((t.name, t.gi_profile))
    products = tuple(sorted({b.product_name for b in catalog.BOARDS.values() if b.product_name}))
    return KnownTypes(tuple(types), source=f"vgpuctl's catalog (boards {', '.join(sorted(catalog.BOARDS))})",
                      listing="for a node's own types give its inventory: --inventory FILE or --simulate",
                      products=products, instances=tuple(instances))


def node_types(inventories: list[dict[str, Any]], simulated: bool) -> KnownTypes:
    """The vGPU types the inventories' GPUs offer (before a GPU's VFs are enabled: what they will offer)."""
    from pydantic import ValidationError

    from dra_bridge.api.names import type_is_mig_backed
    from kubevirt_templates.profiles import KnownTypes
    from kubevirt_templates.render import RenderError
    from mdev_manager.models import Inventory
    from mdev_manager.plan import offered_types  # start-up cost (~80 ms): only for the inventories' types

    types, mig, products = [], set(), set()
    boards: dict[str, str] = {}  # full name -> the board of the GPUs offering it
    instances: dict[str, str] = {}  # full name -> its GPU-instance profile
    for doc in inventories:
        try:
            inv = Inventory.model_validate(doc)
        except ValidationError as exc:
            where = ".".join(str(x) for x in exc.errors()[0]["loc"])
            raise RenderError(f"--inventory: {where or 'the document'} is not as `vgpuctl discover -o yaml` "
                              "writes it; give that command's output") from None
        for gpu in inv.gpus:
            products.add(gpu.model)  # what its whole-GPU device publishes as profile and productName
            for t in offered_types(gpu):
                if type_is_mig_backed(t) and gpu.mig is None:  # no MIG on that GPU (NVML says)
                    mig.add(t.short_name.lower())
                else:
                    types.append((t.id, t.name))
                    boards.setdefault(t.name, f"{gpu.model} (PCI device {gpu.device_id})")
                    if t.gpu_instance_profile:  # the board's word (discovery), where the name's grammar errs
                        instances.setdefault(t.name, t.gpu_instance_profile)
    if simulated and len(inventories) == 1:
        where, listing = "the simulated node", "list them: vgpuctl --simulate discover --types"
    else:
        where, listing = "the given nodes", "list them: vgpuctl discover --types, on the node"
    return KnownTypes(tuple(types), source=where, listing=listing, mig_backed=frozenset(mig),
                      products=tuple(sorted(products)), boards=tuple(boards.items()),
                      instances=tuple(instances.items()))


class SchemaUnavailable(Exception):
    """The schema that was asked for could not be read."""


def kubevirt_schema(args: argparse.Namespace) -> KubeVirtSchema | None:
    """The schema to validate against: the cluster's, a file's, or None (not asked for)."""
    from kubevirt_templates.validate import ENV_SCHEMA, KubeVirtSchema, load_schema

    kubeconfig = getattr(args, "kubeconfig", None)
    context = getattr(args, "context", None)
    if kubeconfig is not None or context is not None:
        # the kubernetes client (~0.9 s): only to read the cluster's schema
        from dra_bridge.apiclient.client import KubeconfigError, api_client_from
        from dra_bridge.apiclient.openapi import KUBEVIRT_V1, OpenApiUnavailable, fetch_kubevirt_openapi

        try:
            api = api_client_from(kubeconfig or None, context)
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
    from kubevirt_templates.validate import ENV_SCHEMA, admission_problems, is_kubevirt

    kubevirt = [o for o in objects if is_kubevirt(o)]
    if not kubevirt:
        return 0
    refused = [p for o in kubevirt for p in admission_problems(o)]
    if refused:  # a template bug: KubeVirt's admission would refuse the object
        for p in refused:
            print(f"error: {p}", file=sys.stderr)
        return 1
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


def _values(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """The values of ``kind``: files, then --set, the inventories for kubevirt-cr, and every vGPU
    type written as the node (or the catalog) spells it. RenderError lists every problem."""
    from kubevirt_templates.profiles import TYPED_KINDS, check_types
    from kubevirt_templates.render import RenderError, render

    values = load_values(args.values, args.set)
    inventories = [_inventory_from_file(p) for p in args.inventory or []]
    simulated = bool(getattr(args, "simulate", None))
    if simulated:
        inventories.append(_simulated_inventory(args))
    if kind == "kubevirt-cr":
        if inventories:
            values["inventories"] = list(values.get("inventories") or []) + inventories
        return values
    if inventories and kind not in TYPED_KINDS:
        raise RenderError(f"--inventory/--simulate: {kind} names no vGPU type; the inventories make "
                          f"kubevirt-cr and check the types of {' and '.join(TYPED_KINDS)}")
    if kind not in TYPED_KINDS:
        return values
    known = node_types(inventories, simulated) if inventories else catalog_types()
    values, problems = check_types(kind, values, known)
    if problems:
        try:
            render(kind, values)  # the other keys' problems too, in one go
        except RenderError as exc:
            said = {p.split(":", 1)[0] for p in problems}
            problems += [p for p in exc.problems if p.split(":", 1)[0] not in said]
        raise RenderError(problems)
    return values


def run(args: argparse.Namespace) -> int:
    from kubevirt_templates.render import RenderError, canonical_kind, render, render_yaml

    _gather(args)
    try:
        kind = canonical_kind(args.kind)
        values = _values(kind, args)
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
    if kind == "kubevirt-cr" and not values.get("inventories") and values.get("classic", True):
        print("note: no inventories: permittedHostDevices left out; the merge patch keeps the CR's own "
              "(--inventory FILE or --simulate generates them)", file=sys.stderr)
    output = getattr(args, "output", None) or getattr(args, "pre_output", None) or "yaml"
    if output == "json":  # several objects, as kubectl prints them: a v1 List
        doc = objects[0] if len(objects) == 1 else {"apiVersion": "v1", "kind": "List", "items": objects}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render_yaml(objects))
    return 0


_SUMMARY = {
    "vm": "a VirtualMachine with vGPUs and/or whole GPUs (device-plugin resources, or claims with mode=dra)",
    "kubevirt-cr": "the KubeVirt CR's GPU settings (permittedHostDevices, feature gates) from the nodes' inventories",
    "deviceclasses": "the driver's two DeviceClasses (vGPUs, whole GPUs)",
    "claim-template": "a ResourceClaimTemplate for one device (by profile, min_memory, first_available or passthrough)",
    "passthrough-pod": "a Pod given a whole GPU bound to vfio-pci through a claim",
}
_EXAMPLES = {
    "vm": "vgpuctl render vm --set name=vm1 --set mode=dra --set gpus.A100-4C=1 --set display=true",
    "kubevirt-cr": "vgpuctl --simulate render kubevirt-cr --set dra=true",
    "deviceclasses": "vgpuctl render deviceclasses",
    "claim-template": "vgpuctl render claim-template --set first_available=[A100-8C,L40S-8Q]",
    "passthrough-pod": "vgpuctl render passthrough-pod --set 'product=TU104GL [Tesla T4]'",
}


class _Quiet(TypedDict, total=False):
    default: str


def _options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The options every kind takes, before its name (``prefix`` "pre_": kept apart, as the kind's
    parser would overwrite them) or after it (absent unless given); :func:`_gather` joins them."""
    from vgpuctl.cli.render_keys import ENV_SCHEMA

    quiet: _Quiet = {} if prefix else {"default": argparse.SUPPRESS}
    p.add_argument("-f", "--values", action="append", metavar="FILE", dest=prefix + "values", **quiet,
                   help="values YAML (repeatable; - for stdin)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", dest=prefix + "set", **quiet,
                   help="set a key (the value is YAML: 2, true, [a, b]); the keys are listed below")
    p.add_argument("--inventory", action="append", metavar="FILE", dest=prefix + "inventory", **quiet,
                   help="a node inventory (`vgpuctl discover -o yaml`; repeatable): kubevirt-cr is made from "
                   "them; vm and claim-template check their vGPU types against them")
    if not prefix:  # before the kind, main's host options take it
        p.add_argument("--simulate", nargs="?", const="default", default=argparse.SUPPRESS, metavar="PRESET",
                       help="use the simulated host's inventory, as --inventory does")
    schema = p.add_mutually_exclusive_group()
    schema.add_argument("--kubeconfig", nargs="?", const="", metavar="FILE", dest=prefix + "kubeconfig", **quiet,
                        help="validate KubeVirt objects against this cluster's schema (/openapi/v3/apis/kubevirt.io/v1); "
                             "FILE, or $KUBECONFIG, ~/.kube/config, in-cluster as kubectl looks")
    p.add_argument("--context", metavar="NAME", dest=prefix + "context", **quiet,
                   help="kubeconfig context to use (default: its current-context)")
    p.add_argument("-o", "--output", choices=("yaml", "json"), dest=prefix + "output", **quiet,
                   help="output format: yaml (documents; the default) or json (one object, or a v1 List)")
    schema.add_argument("--schema", metavar="FILE", dest=prefix + "schema", **quiet,
                        help=f"validate KubeVirt objects against this OpenAPI file (default ${ENV_SCHEMA}); "
                        "KubeVirt's api/openapi-spec/swagger.json or an OpenAPI v3 document")


def _gather(args: argparse.Namespace) -> None:
    """The options given before the kind's name and after it, as one: lists joined, a value after
    the name winning."""
    for name in ("values", "set", "inventory"):
        setattr(args, name, (getattr(args, "pre_" + name, None) or []) + (getattr(args, name, None) or []))
    for name in ("kubeconfig", "schema", "context"):
        after = getattr(args, name, None)
        setattr(args, name, after if after is not None else getattr(args, "pre_" + name, None))


def add_arguments(r: argparse.ArgumentParser) -> None:
    """The ``render`` arguments: one subcommand per kind (the main CLI sets ``func`` to :func:`run`)."""
    from vgpuctl.cli.render_keys import ALIASES, ENV_SCHEMA, KEYS, KINDS

    aliases = {k: [a for a, to in ALIASES.items() if to == k] for k in KINDS}
    r.formatter_class = argparse.RawDescriptionHelpFormatter
    r.description = ("Render KubeVirt and DRA objects as YAML. Values come from -f files and --set KEY=VALUE,\n"
                     "checked before anything is printed: vGPU types against vgpuctl's catalog, or the node's\n"
                     "with --simulate / --inventory; KubeVirt objects also against KubeVirt's admission rules\n"
                     f"and schema (--kubeconfig: the cluster's; --schema or ${ENV_SCHEMA}: a file).")
    r.epilog = "\n\n".join(f"{kind} keys (--set KEY=VALUE; vgpuctl render {kind} -h):\n{KEYS[kind]}"
                           for kind in KINDS)
    _options(r, prefix="pre_")
    kinds = r.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind in KINDS:
        summary = _SUMMARY[kind]
        k = kinds.add_parser(kind, aliases=aliases[kind], help=summary,
                             description=summary[:1].upper() + summary[1:] + ".",
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             epilog=f"keys (--set KEY=VALUE, or KEY: VALUE in a -f file):\n{KEYS[kind]}\n\n"
                                    f"example:\n  {_EXAMPLES[kind]}")
        _options(k)
