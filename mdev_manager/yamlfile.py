"""The one loader for every YAML (or JSON) file a user hands the tools.

Layouts, vgpu-device-manager configs, render values and inventories, objects for ``capacity
--from``, kubeconfigs: all are read here. PyYAML's ``safe_load`` trusts the shape of its input:
of two equal keys it silently keeps the last, it recurses once per nesting level (a
``RecursionError`` a few hundred levels down), it reads whatever it is given (``-f /dev/zero``
never ends) and reads ``1:`` as a number where a name was meant. This loader refuses each of
those before anything is decided, with one line the admin can act on::

    layout.yaml:6:7: duplicate key 'mode' (first at line 5); keep one of them

Pure apart from reading the file: stdlib and PyYAML only, so the decision layer may use it.
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import stat
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.error import Mark
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BYTES = 4 << 20  # a layout of every GPU of a big node is a few KiB
MAX_DEPTH = 100  # Kubernetes objects nest ~10 deep; PyYAML recurses per level (limit ~1000 frames)
_MERGE = "tag:yaml.org,2002:merge"


class YamlFileError(ValueError):
    """A file that cannot be used: ``FILE[:LINE:COL]: what is wrong; how to fix`` (line, column from 1)."""

    def __init__(self, path: str | Path, problem: str, fix: str, line: int | None = None,
                 column: int | None = None):
        self.path, self.problem, self.fix, self.line, self.column = str(path), problem, fix, line, column
        super().__init__(str(self))

    @property
    def location(self) -> str:
        if self.line is None:
            return self.path
        return f"{self.path}:{self.line}" + (f":{self.column}" if self.column is not None else "")

    def __str__(self) -> str:
        return f"{self.location}: {self.problem}; {self.fix}"


class _Refused(Exception):
    """Raised inside the loader; :func:`parse_yaml` adds the file's name."""

    def __init__(self, problem: str, fix: str, mark: Mark | None):
        super().__init__(problem)
        self.problem, self.fix, self.mark = problem, fix, mark


def _size(node: Node) -> int:
    return node.__dict__.get("_vgpuctl_size", 1)


class _Loader(yaml.SafeLoader):
    """SafeLoader that bounds nesting and alias expansion and rejects duplicate and non-text keys."""

    max_depth = MAX_DEPTH
    max_nodes = 1_000_000
    what = "file"

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None and "_vgpuctl_size" not in target.__dict__:
                raise _Refused(f"the alias *{event.anchor} is inside what &{event.anchor} names (a loop)",
                               "an alias may only repeat a finished value", event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise _Refused(f"nested more than {self.max_depth} levels deep",
                               f"a {self.what} is never that deep: check it is the file you meant",
                               self.peek_event().start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        assert node is not None  # PyYAML composes a node here; None is only its answer for no document
        if isinstance(node, SequenceNode):
            size = 1 + sum(_size(c) for c in node.value)
        elif isinstance(node, MappingNode):
            size = 1 + sum(_size(k) + _size(v) for k, v in node.value)
        else:
            size = 1
        if size > self.max_nodes:
            raise _Refused(f"expands to more than {self.max_nodes:,} values (aliases repeat what they name)",
                           "write the values out, or use fewer aliases", node.start_mark)
        node.__dict__["_vgpuctl_size"] = size
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue  # `<<: *base` merges; the keys written beside it override, as YAML means
                if not isinstance(key_node, ScalarNode):
                    raise _Refused("a key must be a name, not a list or mapping", "write the key as text",
                                   key_node.start_mark)
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise _Refused(_not_text(key_node.value, key), f'quote it: "{key_node.value}"',
                                   key_node.start_mark)
                if key in seen:
                    raise _Refused(f"duplicate key {key!r} (first at line {seen[key].line + 1})",
                                   "keep one of them", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _not_text(written: str, value: Any) -> str:
    kind = {bool: "a boolean", int: "a number", float: "a number", type(None): "null"}.get(type(value),
                                                                                         type(value).__name__)
    return f"the key {written} is read as {kind} ({value!r}), not as a name"


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _decode(data: bytes, name: str) -> str:
    """UTF-8 (with or without a BOM), or UTF-16/32 with a BOM, as the YAML spec allows."""
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        encoding = "utf-32"
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16"
    else:
        encoding = "utf-8-sig"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise YamlFileError(name, f"not {encoding.upper().removesuffix('-SIG')} text "
                                  f"(byte 0x{data[exc.start]:02x})",
                            "save it as UTF-8 (is it a binary file?)", line, col) from None


def _open_fix(err: int | None) -> str:
    if err in (errno.EACCES, errno.EPERM):
        return "check its permissions, or run as root"
    if err in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG):
        return "check the path"
    return "check the file system it is on"


def _kind(mode: int) -> str | None:
    """What a non-regular file is, for the message; None for a regular file or a pipe."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def _too_big(name: str, what: str, max_bytes: int) -> YamlFileError:
    return YamlFileError(name, f"larger than {_human(max_bytes)}, more than a {what} can be",
                         "check it is the file you meant")


def _human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} bytes"


def read_bytes(path: str | Path, *, what: str = "file", max_bytes: int = MAX_BYTES) -> bytes:
    """At most ``max_bytes`` of a regular file or a pipe (``-``: stdin); anything else is refused.

    The type is checked before the open: opening a device can have effects (a tape rewinds,
    a watchdog arms) and reading one may never end (``/dev/zero``).
    """
    name = str(path)
    if name == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise _too_big("<stdin>", what, max_bytes)
        return data
    try:
        st = os.stat(path)
        kind = _kind(st.st_mode)
        if kind == "a directory":
            raise YamlFileError(name, f"is a directory, not a {what}", "name the file itself")
        if kind is not None:
            raise YamlFileError(name, f"is {kind}, not a {what}", "give a regular file")
        if stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
            raise _too_big(name, what, max_bytes)
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        try:
            kind = _kind(os.fstat(fd).st_mode)  # replaced since the stat
            if kind is not None:
                raise YamlFileError(name, f"is {kind}, not a {what}", "give a regular file")
            chunks, total = [], 0
            while total <= max_bytes:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise YamlFileError(name, exc.strerror or str(exc), _open_fix(exc.errno)) from None
    if total > max_bytes:
        raise _too_big(name, what, max_bytes)
    return b"".join(chunks)


def _yaml_error(name: str, text: str, exc: yaml.YAMLError, what: str) -> YamlFileError:
    if isinstance(exc, yaml.reader.ReaderError):
        line, col = _line_col(text, exc.position)
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return YamlFileError(name, f"not valid YAML: the character U+{ord(char):04X} is not allowed",
                             "remove it (is it a binary file?)", line, col)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if not problem:  # PyYAML's whole text, which calls a parsed string "<unicode string>": say the file
        problem, context = " ".join(str(exc).replace("<unicode string>", name).split()), None
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None and mark is not context_mark:
        problem += f" ({context} at line {context_mark.line + 1})"
    elif context:
        problem = f"{context}, {problem}"
    if "expected a single document" in problem:
        fix = f"a {what} holds one document: remove the '---' and what follows"
    elif isinstance(exc, yaml.constructor.ConstructorError):
        fix = "remove the tag (plain YAML only)"
    else:
        fix = "fix the YAML there (indentation, quotes, brackets; a ': ' inside a value needs quotes)"
    if mark is None:
        return YamlFileError(name, f"not valid YAML: {problem}", fix)
    return YamlFileError(name, f"not valid YAML: {problem}", fix, mark.line + 1, mark.column + 1)


def _depth(doc: Any) -> int:
    """How deep a JSON value nests (iteratively: the point is not to recurse)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, d = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, d)
            stack += [(v, d + 1) for v in (value.values() if isinstance(value, dict) else value)]
    return deepest


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Duplicate
    return out


def _record_lines(root: Node, lines: dict[tuple, int]) -> None:
    """Where each key and list item of a document is written: ``("layouts", "default", 0)`` -> line
    (from 1), so a problem found after parsing can name its line. Iterative, each node once (an
    alias repeats a node: its place is where it was first written)."""
    seen: set[int] = set()
    stack: list[tuple[Node, tuple]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for key, value in node.value:
                if isinstance(key, ScalarNode) and key.tag != _MERGE:
                    lines.setdefault(path + (key.value,), key.start_mark.line + 1)
                    stack.append((value, path + (key.value,)))
        elif isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                lines.setdefault(path + (i,), item.start_mark.line + 1)
                stack.append((item, path + (i,)))


def parse_yaml(text: str, *, name: str = "<input>", what: str = "file", max_depth: int = MAX_DEPTH,
               max_nodes: int | None = None, all_documents: bool = False, json_first: bool = False,
               lines: dict[tuple, int] | None = None) -> Any:
    """``text`` as YAML: one document (None when empty), or with ``all_documents`` the list of them.

    ``json_first`` tries JSON first (``kubectl -o json`` output is parsed much faster that way);
    whatever JSON cannot say precisely (a duplicate key, the nesting) is read again as YAML,
    which names the line. ``lines``, when given, is filled with the line of every key and list
    item of the (single) document, by path: problems found later can say where they are.
    """
    if json_first and lines is None and text.lstrip()[:1] in ("{", "["):
        try:
            doc = json.loads(text, object_pairs_hook=_no_duplicates)
            if _depth(doc) <= max_depth:
                return [doc] if all_documents else doc
        except (ValueError, RecursionError):
            pass  # YAML reads JSON too, and says what is wrong where
    loader_cls = type("Loader", (_Loader,), {"max_depth": max_depth, "what": what,
                                              "max_nodes": max_nodes or max(100_000, len(text))})
    loader = None
    try:
        loader = loader_cls(text)  # checks the characters at once
        loader.name = name  # every mark (and PyYAML's own wording) names the file, not "<unicode string>"
        if all_documents:
            docs = []
            while loader.check_data():
                docs.append(loader.get_data())
            return docs
        node = loader.get_single_node()
        if node is None:
            return None
        if lines is not None:
            _record_lines(node, lines)
        return loader.construct_document(node)
    except _Refused as exc:
        line, col = (exc.mark.line + 1, exc.mark.column + 1) if exc.mark is not None else (None, None)
        raise YamlFileError(name, exc.problem, exc.fix, line, col) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(name, text, exc, what) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path, *, what: str = "layout file", max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH, all_documents: bool = False, json_first: bool = False,
              lines: dict[tuple, int] | None = None) -> Any:
    """The file at ``path`` (``-``: stdin) as YAML, or :class:`YamlFileError` saying where and how to
    fix it; ``lines`` as for :func:`parse_yaml`."""
    name = "<stdin>" if str(path) == "-" else str(path)
    text = _decode(read_bytes(path, what=what, max_bytes=max_bytes), name)
    return parse_yaml(text, name=name, what=what, max_depth=max_depth, all_documents=all_documents,
                      json_first=json_first, lines=lines)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "YamlFileError", "load_yaml", "parse_yaml", "read_bytes"]
