"""What ``apply`` and ``plan`` tell a person by default: one row per GPU, what is blocked and why.

Applying 512 vGPUs is 1,024 steps; the admin wants to know what changed on which GPU, what did
not and why. :func:`gpu_rows` folds a reconcile outcome into one row per physical GPU (pure: no
host access, tested on data and against golden files), :func:`summary` lays the rows and the
reasons out with ``rich`` (plain text in pipes). Every step is shown only with ``-v``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text

from mdev_manager.actions import (
    STRUCTURAL,
    BindDriver,
    CreateMdev,
    DisableVfs,
    EnableVfs,
    RemoveDefinition,
    RemoveMdev,
    SaveDefinition,
    SaveVendorRecord,
    SetMixedSize,
    SetVgpuType,
)
from mdev_manager.config import GpuLayout
from mdev_manager.models import Blocked, Inventory
from mdev_manager.plan import native_driver, offered_types, resolve_type, select_gpus
from mdev_manager.reconcile import Round
from vgpuctl.output.tables import allot, fit_lines
from vgpuctl.output.text import TypeNames, step_text

LISTED = 10  # blocked devices, failed steps and reasons listed by default; -v lists them all


@dataclass
class GpuRow:
    """What a plan or an apply does to one physical GPU."""

    index: int
    address: str
    model: str
    mode: str  # the layout's mode for it; "-" when the layout leaves it alone
    setup: list[str] = field(default_factory=list)  # driver, VFs, saved definitions
    created: Counter = field(default_factory=Counter)  # type name -> vGPUs
    removed: Counter = field(default_factory=Counter)
    kept: Counter = field(default_factory=Counter)
    then: Counter = field(default_factory=Counter)  # plan: vGPUs planned once the driver and VF steps ran
    blocked: int = 0
    failed: int = 0


def _steps(rounds: list[Round]):
    """(step, result) over every round; result None: only planned (a dry run)."""
    for r in rounds:
        results = r.report.results if r.report is not None else [None] * len(r.plan.actions)
        yield from zip(r.plan.actions, results, strict=False)


def _setup(a, row_gpu, done: bool) -> str | None:
    """The wording of a driver or VF step, as planned or as done."""
    if isinstance(a, EnableVfs):
        return f"{a.count} VFs enabled" if done else f"enable {a.count} VFs"
    if isinstance(a, DisableVfs):
        return "VFs disabled" if done else "disable VFs"
    if isinstance(a, SetMixedSize):
        return "mixed-size mode on" if done else "switch to mixed-size mode"
    if isinstance(a, BindDriver):
        driver = a.driver or (native_driver(row_gpu) if row_gpu is not None else None) or "its native driver"
        return f"bound to {driver}" if done else f"bind to {driver}"
    return None


def gpu_rows(before: Inventory, layouts: list[GpuLayout], rounds: list[Round], blocked: list[Blocked],
             names: TypeNames, *, after: Inventory | None = None) -> list[GpuRow]:
    """One row per GPU of ``before`` (the node the first round planned on).

    A step counts when it succeeded (apply) or is planned (plan); a failed one only in ``failed``.
    """
    modes = {addr: e for addr, e in select_gpus(before, layouts).items()}
    rows = {g.address: GpuRow(index=g.index, address=g.address, model=g.model,
                              mode=modes[g.address].mode if g.address in modes else "-") for g in before.gpus}
    vgpus = {v.id: v for inv in (after, before) if inv for v in inv.all_vgpus()}
    dry = any(r.report is None for r in rounds)

    def type_of(device: str, gpu: str) -> str:
        v = vgpus.get(device)
        return names(gpu, v.type_id) if v is not None else "vGPU"

    gone: set[str] = set()
    persisted: Counter = Counter()
    forgotten: Counter = Counter()
    for r in rounds:
        made = {a.uuid for a in r.plan.actions if isinstance(a, CreateMdev)}
        made |= {a.vf for a in r.plan.actions if isinstance(a, SetVgpuType)}
        dropped = {a.uuid for a in r.plan.actions if isinstance(a, RemoveMdev)}
        dropped |= {a.vf for a in r.plan.actions if isinstance(a, SetVgpuType) and a.type_id == "0"}
        results = r.report.results if r.report is not None else [None] * len(r.plan.actions)
        for a, res in zip(r.plan.actions, results, strict=False):
            row = rows.get(a.gpu)
            if row is None:
                continue
            if res is not None and not res.ok:
                row.failed += 1
                continue
            if isinstance(a, CreateMdev) or (isinstance(a, SetVgpuType) and a.type_id != "0"):
                row.created[names(a.gpu, a.type_id)] += 1
            elif isinstance(a, (RemoveMdev, SetVgpuType)):
                device = a.uuid if isinstance(a, RemoveMdev) else a.vf
                row.removed[type_of(device, a.gpu)] += 1
                gone.add(device)
            elif isinstance(a, (SaveDefinition, SaveVendorRecord)):
                device = a.uuid if isinstance(a, SaveDefinition) else a.vf
                if getattr(a, "type_id", None) is None and device not in dropped:
                    forgotten[a.gpu] += 1
                elif a.type_id is not None and device not in made:
                    persisted[a.gpu] += 1
            elif isinstance(a, RemoveDefinition) and a.uuid not in dropped:
                forgotten[a.gpu] += 1
            else:
                text = _setup(a, before.gpu(a.gpu), done=res is not None)
                if text and text not in row.setup:
                    row.setup.append(text)
    for addr, n in persisted.items():
        rows[addr].setup.append(f"{n} vGPUs persisted" if not dry else f"persist {n} vGPUs")
    for addr, n in forgotten.items():
        rows[addr].setup.append(f"{n} saved vGPUs forgotten" if not dry else f"forget {n} saved vGPUs")
    for g in before.gpus:
        rows[g.address].kept.update(names(g.address, v.type_id) for v in g.vgpus if v.id not in gone)
    for b in blocked:
        if b.gpu in rows:
            rows[b.gpu].blocked += 1
    if dry:  # vGPUs of a GPU that first needs its driver or VFs are planned in a later round
        for r in rounds:
            for addr in {a.gpu for a in r.plan.actions if isinstance(a, STRUCTURAL)}:
                entry, gpu = modes.get(addr), before.gpu(addr)
                if entry is None or entry.mode != "vgpu" or gpu is None:
                    continue
                for ref, n in entry.vgpus.items():
                    t = resolve_type(offered_types(gpu), ref)
                    if n > 0:
                        rows[addr].then[names(addr, t.id) if t else ref] += n
    return [rows[g.address] for g in before.gpus]


def _counts(c: Counter) -> str:
    return ", ".join(f"{n} x {name}" for name, n in sorted(c.items())) or "-"


def _table(rows: list[GpuRow], dry: bool, wide: bool = False) -> Table:
    """80 columns: the model is left to ``discover``, a column of nothing but ``-`` is left out and the
    lists fold onto more lines (``wide``: every column, one line per GPU). Addresses never fold."""
    heads = ["GPU", "ADDRESS"] + (["MODEL"] if wide else []) + ["MODE", "SETUP"]
    heads += ["CREATE", "REMOVE", "KEEP"] if dry else ["CREATED", "REMOVED", "KEPT"]
    heads += ["BLOCKED"] + (["FAILED"] if any(r.failed for r in rows) else [])
    cells_of = []
    for r in rows:
        created = _counts(r.created)
        if r.then:
            created = ("" if created == "-" else created + ", ") + "then " + _counts(r.then)
        cells = [str(r.index), r.address] + ([r.model] if wide else []) + [
            r.mode, ", ".join(r.setup) or "-", created, _counts(r.removed), _counts(r.kept),
            f"{r.blocked} in use" if r.blocked else "-"]
        if "FAILED" in heads:
            cells.append(str(r.failed) if r.failed else "-")
        cells_of.append(cells)
    if not wide:  # a column with nothing to say gives its room to the others
        keep = [i for i, h in enumerate(heads) if h in ("GPU", "ADDRESS", "MODE", "CREATE", "CREATED")
                or any(c[i] != "-" for c in cells_of)]
        heads, cells_of = [heads[i] for i in keep], [[c[i] for i in keep] for c in cells_of]
    fold = heads[heads.index("MODE") + 1:]
    widths = allot(heads, cells_of, fold=() if wide else fold)
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, 2, 0, 0))
    for h, w in zip(heads, widths, strict=True):
        t.add_column(h, no_wrap=h not in fold or wide, max_width=None if wide or h not in fold else w)
    for r, cells in zip(rows, cells_of, strict=True):
        style = "red" if r.failed else "yellow" if r.blocked else None
        t.add_row(*(Text(c) for c in cells), style=style)
    return t


def _capped(lines: list[str], verbose: bool, what: str) -> list[str]:
    if verbose or len(lines) <= LISTED:
        return lines
    return lines[:LISTED] + [f"  ... and {len(lines) - LISTED} more {what} (-v lists them all)"]


def blocked_lines(blocked: list[Blocked], verbose: bool = False) -> list[str]:
    """Each device in use that keeps the node from the layout, its holders, what waits for it."""
    items = [[f"  GPU {b.gpu}: left the bus", f"    {b.blocks}"] if b.gone else
             [f"  {b.device} on GPU {b.gpu}: held by {'; '.join(b.held_by)}", f"    blocks {b.blocks}"]
             for b in blocked]
    shown = items if verbose or len(items) <= LISTED else items[:LISTED]
    head = "Blocked by devices in use:" if not any(b.gone for b in blocked) else \
        "Blocked by devices in use, or waiting for GPUs that left the bus:"
    lines = [head] + [line for pair in shown for line in pair]
    if len(shown) < len(items):
        lines.append(f"  ... and {len(items) - len(shown)} more devices in use (-v lists them all)")
    return lines


def summary(before: Inventory, layouts: list[GpuLayout], rounds: list[Round], blocked: list[Blocked],
            names: TypeNames, *, after: Inventory | None = None, verbose: bool = False,
            wide: bool = False) -> list[Text | Table]:
    """The table, then what is blocked, what failed, what was not done and why."""
    dry = any(r.report is None for r in rounds)
    rows = gpu_rows(before, layouts, rounds, blocked, names, after=after)
    out: list[Text | Table] = [_table(rows, dry, wide)]
    if blocked:
        out.append(Text("\n".join(blocked_lines(blocked, verbose)), style="yellow"))
    failed = [f"  {step_text(a, names)}: {res.error or 'skipped'}" + (f" ({res.message})" if res.message else "")
              for a, res in _steps(rounds) if res is not None and not res.ok]
    if failed:
        out.append(Text("\n".join(["Failed steps:"] + _capped(failed, verbose, "failed steps")), style="red"))
    last = rounds[-1].plan if rounds else None
    held_gpus = {b.gpu for b in blocked}
    index = {g.address: g.index for g in before.gpus}
    # GPU-wide reasons (full, no VF left, passed through); those of a blocked GPU are in its block
    why = [f"  GPU {index[s.device]}: {s.reason}" for s in (last.skipped if last else [])
           if s.device in index and s.device not in held_gpus]
    if why:
        out.append(Text("\n".join(["Not done:"] + _capped(why, verbose, "reasons"))))
    notes = _once(n for r in rounds for n in r.plan.notes)
    if notes:
        out.append(Text("\n".join(fit_lines(f"note: {n}") for n in notes)))
    return out


#: a plan's preview of a mixed-size GPU's placements, and the later round's placements themselves
_PREVIEW, _PLACED = ": once in mixed-size mode, places ", ": places "


def _once(notes: Iterable[str]) -> list[str]:
    """Each note once: a round's repeat dropped, and a GPU's placement preview (the first round, while
    the GPU is not in mixed-size mode yet) dropped where a later round placed its vGPUs, whose note
    says the same, done (an apply said every placement twice)."""
    out = list(dict.fromkeys(notes))
    placed = {n.split(_PLACED, 1)[0] for n in out if _PLACED in n and _PREVIEW not in n}
    return [n for n in out if not (_PREVIEW in n and n.split(_PREVIEW, 1)[0] in placed)]
