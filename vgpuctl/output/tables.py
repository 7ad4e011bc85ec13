"""Tables that fit an 80-column terminal, and in a pipe the same lines.

A table's columns are either fixed (never cut: PCI addresses, numbers, states) or foldable (names,
lists of profiles): when the natural width passes :data:`WIDTH`, the foldable ones share what the
fixed ones leave and their cells wrap onto more lines (at spaces, commas and hyphens; a word
longer than its column is broken). ``-o wide`` keeps every cell on one line. GPU models are
shortened to what admins call them (``AD102GL [L40S]`` -> ``L40S``).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

WIDTH = 80
GAP = 2
_MIN_FOLD = 8
_BRAND = re.compile(r"\b(Tesla|NVIDIA|PCIe|SXM\d?|NVL|HGX)\b\s*")
#: The Blackwell data-center edition, left out: "RTX PRO 4500 BSE" would still wrap discover's MODEL
#: column, and the Server Edition is the one these boards come in on a vGPU host (``-o wide`` and
#: ``-o json`` keep it; the workstation editions keep their longer names).
_EDITION = re.compile(r"\bBlackwell Server Edition\b")


def short_model(product: str | None) -> str:
    """``AD102GL [L40S]`` -> ``L40S``, ``GA100 [A100 PCIe 40GB]`` -> ``A100 40GB``, ``TU104GL [Tesla T4]``
    -> ``T4``, ``... [RTX PRO 6000 Blackwell Server Edition]`` -> ``RTX PRO 6000``: the marketing
    name in the PCI database's brackets, without brand and form factor (``-o json`` keeps it whole)."""
    if not product:
        return "?"
    m = re.search(r"\[([^\]]+)\]", product)
    name = _EDITION.sub("", _BRAND.sub("", m.group(1) if m else product)).strip()
    return " ".join(name.split()) or product


def allot(header: Sequence[str], rows: Sequence[Sequence[str]], *, fold: Sequence[str] = (),
          width: int = WIDTH) -> list[int]:
    """Each column's width: natural if the table fits ``width``, else the foldable columns (``fold``,
    by header) narrowed to what the fixed ones leave: each first gets its longest word, then (the
    cheapest first) its longest list item, so ``T4-8Q 2`` stays on one line, then the spare room goes
    to the columns closest to their natural width, so as few cells wrap as can."""
    cells = [[str(r[i]) for r in rows] for i in range(len(header))]
    natural = [max([len(h), *(len(x) for c in col for x in c.split("\n"))]) for h, col in zip(header, cells, strict=True)]
    total = sum(natural) + GAP * (len(header) - 1)
    flex = [i for i, h in enumerate(header) if h in fold]
    if total <= width or not flex:
        return natural
    room = width - sum(w for i, w in enumerate(natural) if i not in flex) - GAP * (len(header) - 1)
    out = list(natural)
    items = {}
    for i in flex:
        words = [len(w) for c in cells[i] for w in _BREAKS.split(c)] + [len(header[i])]
        out[i] = min(natural[i], max(_MIN_FOLD, max(words)))
        items[i] = min(natural[i], max([out[i], *(len(x) for c in cells[i] for x in _ITEMS.split(c))]))
    spare = room - sum(out[i] for i in flex)
    if spare < 0:  # even the longest words do not fit: share the room, breaking words
        for i in flex:
            out[i] = max(_MIN_FOLD, room * out[i] // max(1, sum(out[j] for j in flex)))
        return out
    for i in sorted(flex, key=lambda i: items[i] - out[i]):  # whole list items first, the cheapest first
        if items[i] - out[i] <= spare:
            spare -= items[i] - out[i]
            out[i] = items[i]
    for i in sorted(flex, key=lambda i: natural[i] - out[i]):  # then fill the nearly-fitting
        add = min(spare, natural[i] - out[i])
        out[i] += add
        spare -= add
    return out


_ITEMS = re.compile(r"(?<=,) ")
_BREAKS = re.compile(r"[\s,]+|(?<=-)")


def wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``: whole list items (``a, b``) where they fit, else
    broken after spaces and hyphens."""
    if len(text) <= width:
        return [text]
    out: list[str] = []
    for part in text.split("\n"):
        line = ""
        for item in re.split(r"(?<=,) ", part):
            if line and len(line) + 1 + len(item) <= width:
                line += " " + item
                continue
            if line:
                out.append(line)
            pieces = textwrap.wrap(item, width, break_long_words=True, break_on_hyphens=True) or [""]
            out += pieces[:-1]
            line = pieces[-1]
        out.append(line)
    return out


def fit(header: Sequence[str], rows: Sequence[Sequence[str]], *, fold: Sequence[str] = (), wide: bool = False,
        width: int = WIDTH) -> str:
    """A plain-text table; unless ``wide``, no line longer than ``width`` when the fixed columns allow."""
    rows = [[str(c) for c in r] for r in rows]
    widths = allot(header, rows, fold=() if wide else fold, width=width)
    lines = []
    for r in [list(header), *rows]:
        cells = [wrap(c, w) for c, w in zip(r, widths, strict=True)]
        for k in range(max(len(c) for c in cells)):
            parts = [(c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)]
            lines.append((" " * GAP).join(parts).rstrip())
    return "\n".join(lines)


def fit_lines(text: str, width: int = WIDTH, indent: str = "  ") -> str:
    """Prose lines (notes, verdicts) wrapped at ``width``; continuation lines indented. A word is
    never cut (a path, an address): one longer than the line stands alone."""
    out = []
    for line in text.split("\n"):
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False) or [""]  # a path longer than a line stays whole
    return "\n".join(out)


def fit_text(text: str, width: int = WIDTH) -> str:
    """A report's lines at ``width``: a longer line goes on below, indented past its own indentation."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line.strip(), width, initial_indent=lead, subsequent_indent=lead + "    ",
                             break_long_words=False, break_on_hyphens=False)
    return "\n".join(out)
