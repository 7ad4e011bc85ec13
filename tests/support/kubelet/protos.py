"""The kubelet side's messages, compiled at test time from the UPSTREAM kubelet protos.

Source, first found wins (:data:`SOURCE` says which, for skip reasons and report headers):

1. ``$VGPUCTL_UPSTREAM_PROTOS``: the ``kubelet-proto`` folder of the upstream copies (or the
   ``upstream`` folder holding it);
2. ``../shared/reference/upstream/kubelet-proto`` beside the repository: byte copies of
   kubernetes/kubelet's ``pkg/apis/...`` protos (its README names the commit);
3. the test's own copies in ``tests/support/kubelet/proto/`` (written from the documented
   fields), only when neither is there.

Built from upstream, the tests catch a mistake in our protos (``dra_bridge/rpc/proto``)
or in what we answer that our own copies would repeat on both sides. The upstream files are
never edited: those that import gogo's ``gogoproto/gogo.proto`` (older kubelet releases) get
a stub declaring the gogo options they use, written into a temporary include directory.

The upstream packages are the ones our stubs use (they must be: the package is part of the
gRPC method path), and two files defining the same fully-qualified message cannot both live
in protobuf's default descriptor pool. So no ``_pb2`` modules are generated here: the files
are compiled with ``grpc_tools.protoc --descriptor_set_out`` on first use, the
``FileDescriptorSet`` goes into a *private* ``DescriptorPool``, and message classes are built
from it with ``message_factory``. gRPC calls go through generic callables with explicit
method paths, so both sides share only the wire format, as with a real kubelet. This module
is what the tests hand :mod:`dra_bridge.rpc.dra_client` as its ``protos``.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

ENV_UPSTREAM = "VGPUCTL_UPSTREAM_PROTOS"
OWN_PROTO_DIR = Path(__file__).resolve().parent / "proto"
#: Where a checkout next to ../shared finds the upstream copies.
SHARED_UPSTREAM = Path(__file__).resolve().parents[4] / "shared" / "reference" / "upstream" / "kubelet-proto"

# proto packages (the same upstream and in our copies)
DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1"
DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1"
PLUGIN_REGISTRATION = "pluginregistration"
DRA_HEALTH = "v1alpha1"
DRA_HEALTH_V1 = "v1"
DEVICE_PLUGIN = "v1beta1"


def _select() -> tuple[Path, bool, str]:
    """(include dir, upstream?, one line saying which) — no I/O beyond stat."""
    env = os.environ.get(ENV_UPSTREAM)
    if env:
        root = Path(env)
        if (root / "kubelet-proto").is_dir():
            root = root / "kubelet-proto"
        return root, True, f"upstream kubelet protos from ${ENV_UPSTREAM} ({root})"
    if SHARED_UPSTREAM.is_dir():
        return SHARED_UPSTREAM, True, f"upstream kubelet protos ({SHARED_UPSTREAM})"
    return OWN_PROTO_DIR, False, (f"the tests' own proto copies ({OWN_PROTO_DIR}): upstream not found, "
                                  f"set ${ENV_UPSTREAM} or provide {SHARED_UPSTREAM}")


PROTO_ROOT, UPSTREAM, SOURCE = _select()

# gogo.proto options kubelet protos have used: name, the options message it extends, its type and
# field number. A stub declaring the used ones lets protoc accept e.g.
# ``option (gogoproto.marshaler_all) = true;`` without gogo's own file.
_GOGO_TABLE = """
FileOptions bool goproto_getters_all 63001 goproto_enum_prefix_all 63002 goproto_stringer_all 63003
  verbose_equal_all 63004 face_all 63005 gostring_all 63006 populate_all 63007 stringer_all 63008
  onlyone_all 63009 equal_all 63013 description_all 63014 testgen_all 63015 benchgen_all 63016
  marshaler_all 63017 unmarshaler_all 63018 stable_marshaler_all 63019 sizer_all 63020
  goproto_enum_stringer_all 63021 enum_stringer_all 63022 unsafe_marshaler_all 63023
  unsafe_unmarshaler_all 63024 goproto_extensions_map_all 63025 goproto_unrecognized_all 63026
  gogoproto_import 63027 protosizer_all 63028 compare_all 63029 typedecl_all 63030 enumdecl_all 63031
  goproto_registration 63032 messagename_all 63033 goproto_sizecache_all 63034 goproto_unkeyed_all 63035
MessageOptions bool goproto_getters 64001 goproto_stringer 64003 verbose_equal 64004 face 64005
  gostring 64006 populate 64007 stringer 67008 onlyone 64009 equal 64013 description 64014
  testgen 64015 benchgen 64016 marshaler 64017 unmarshaler 64018 stable_marshaler 64019 sizer 64020
  goproto_unrecognized 64026 protosizer 64028 compare 64029 typedecl 64030 messagename 64033
  goproto_sizecache 64034 goproto_unkeyed 64035
FieldOptions bool nullable 65001 embed 65002 stdtime 65010 stdduration 65011 wktpointer 65012
FieldOptions string customtype 65003 customname 65004 jsontag 65005 moretags 65006 casttype 65007
  castkey 65008 castvalue 65009
EnumOptions bool goproto_enum_prefix 62001 goproto_enum_stringer 62021 enum_stringer 62022 enumdecl 62024
EnumOptions string enum_customname 62023
EnumValueOptions string enumvalue_customname 66001
"""


def _gogo_options(table: str) -> dict[str, tuple[str, str, int]]:
    """name -> (options message, type, number) from :data:`_GOGO_TABLE`."""
    out: dict[str, tuple[str, str, int]] = {}
    for block in re.split(r"\n(?=\S)", table.strip()):
        target, kind, *pairs = block.split()
        out.update({name: (target, kind, int(num)) for name, num in zip(pairs[::2], pairs[1::2], strict=False)})
    return out


_GOGO_OPTIONS = _gogo_options(_GOGO_TABLE)
GOGO_IMPORT = "github.com/gogo/protobuf/gogoproto/gogo.proto"
_GOGO_USE = re.compile(r"\(gogoproto\.(\w+)\)")


def gogo_stub(used: set[str]) -> str:
    """A ``gogo.proto`` declaring just the ``used`` options (their names, types and numbers)."""
    unknown = sorted(used - _GOGO_OPTIONS.keys())
    if unknown:
        raise ValueError(f"upstream protos use gogoproto options this stub does not declare: {unknown}")
    by_target: dict[str, list[str]] = {}
    for name in sorted(used):
        target, kind, number = _GOGO_OPTIONS[name]
        by_target.setdefault(target, []).append(f"  optional {kind} {name} = {number};")
    body = "".join(f"extend google.protobuf.{t} {{\n" + "\n".join(lines) + "\n}\n"
                   for t, lines in sorted(by_target.items()))
    return 'syntax = "proto2";\npackage gogoproto;\nimport "google/protobuf/descriptor.proto";\n' + body


def _compile(root: Path) -> bytes:
    import grpc_tools
    from grpc_tools import protoc  # test dependency (grpcio-tools)

    if not root.is_dir():
        raise FileNotFoundError(f"kubelet protos: {root} is not a directory ({SOURCE})")
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.proto"))
    texts = [(root / f).read_text() for f in files]
    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/descriptor.proto
    with tempfile.TemporaryDirectory(prefix="kubelet-protos-") as tmp:
        includes = [f"-I{root}", f"-I{well_known}"]
        if any(GOGO_IMPORT in t for t in texts):
            stub = Path(tmp) / "include" / GOGO_IMPORT
            stub.parent.mkdir(parents=True)
            stub.write_text(gogo_stub({m for t in texts for m in _GOGO_USE.findall(t)}))
            includes.append(f"-I{Path(tmp) / 'include'}")
        out = Path(tmp) / "set.binpb"
        rc = protoc.main(["protoc", *includes, "--include_imports", f"--descriptor_set_out={out}", *files])
        if rc != 0:
            raise RuntimeError(f"protoc failed ({rc}) on {files} in {root}")
        return out.read_bytes()


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    fds = descriptor_pb2.FileDescriptorSet.FromString(_compile(PROTO_ROOT))
    p = descriptor_pool.DescriptorPool()
    for f in fds.file:  # --include_imports lists dependencies first
        p.AddSerializedFile(f.SerializeToString())
    return p


@functools.cache
def message(full_name: str) -> type[Any]:
    """Message class for e.g. ``v1beta1.RegisterRequest`` from the private pool."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))


def enum_value(full_enum: str, name: str) -> int:
    return pool().FindEnumTypeByName(full_enum).values_by_name[name].number


def enum_name(full_enum: str, number: int) -> str:
    return pool().FindEnumTypeByName(full_enum).values_by_number[number].name


class Method:
    """One RPC of the private pool: path plus (de)serialisers."""

    def __init__(self, service: str, method: str) -> None:
        svc = pool().FindServiceByName(service)
        m = svc.methods_by_name[method]
        self.path = f"/{service}/{method}"
        self.request = message_factory.GetMessageClass(m.input_type)
        self.response = message_factory.GetMessageClass(m.output_type)
        self.server_streaming = m.server_streaming

    def unary(self, channel: Any) -> Any:
        return channel.unary_unary(
            self.path, request_serializer=self.request.SerializeToString, response_deserializer=self.response.FromString
        )

    def stream(self, channel: Any) -> Any:
        return channel.unary_stream(
            self.path, request_serializer=self.request.SerializeToString, response_deserializer=self.response.FromString
        )
