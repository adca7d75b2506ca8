"""The shipped generated module lowlat_mw/proto/lowlat_v1_pb2.py matches lowlat_v1.proto.

protoc runs on the .proto into a temporary directory and the FileDescriptorProto it embeds is
compared with the one shipped. The generated file is parsed with `ast`, never imported (importing
it would register a second "lowlat_v1.proto" in the default descriptor pool).
"""

from __future__ import annotations

import ast
import importlib.resources
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from lowlat_mw.errors import ErrorCode
from lowlat_mw.proto import lowlat_v1_pb2 as pb

grpc_tools = pytest.importorskip("grpc_tools")
from grpc_tools import protoc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "lowlat_mw" / "proto"
PROTO = PROTO_DIR / "lowlat_v1.proto"
SHIPPED = PROTO_DIR / "lowlat_v1_pb2.py"
REGENERATE = (
    "python -m grpc_tools.protoc -I lowlat_mw/proto --python_out=lowlat_mw/proto "
    "--pyi_out=lowlat_mw/proto lowlat_mw/proto/lowlat_v1.proto"
)
STALE = f"lowlat_mw/proto/lowlat_v1_pb2.py is stale: regenerate it from the repository root with\n    {REGENERATE}"


def serialized_file(source: str) -> bytes:
    """The bytes literal passed to ``AddSerializedFile(...)`` in a generated module."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "AddSerializedFile"):
            (arg,) = node.args
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, bytes)
            return arg.value
    raise AssertionError("no AddSerializedFile(b'...') call in the generated module")


def describe(serialized: bytes) -> str:
    fdp = descriptor_pb2.FileDescriptorProto.FromString(serialized)
    return str(fdp)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("protoc")
    well_known = importlib.resources.files("grpc_tools") / "_proto"  # google/protobuf/struct.proto
    rc = protoc.main([
        "grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{well_known}",
        f"--python_out={out}", f"--pyi_out={out}", str(PROTO),
    ])
    assert rc == 0, f"protoc failed on {PROTO} (exit {rc})"
    return out


def test_shipped_module_embeds_what_protoc_generates(generated: Path) -> None:
    fresh = serialized_file((generated / "lowlat_v1_pb2.py").read_text())
    shipped = pb.DESCRIPTOR.serialized_pb
    if fresh != shipped:
        # Show what changed (messages, fields, enum values) before the fix.
        import difflib

        diff = "\n".join(difflib.unified_diff(describe(shipped).splitlines(), describe(fresh).splitlines(),
                                              "shipped", "lowlat_v1.proto", lineterm="", n=2))
        pytest.fail(f"{STALE}\n\n{diff}", pytrace=False)


def test_shipped_source_matches_the_imported_descriptor() -> None:
    # The file on disk is the module that is imported (no stale .pyc or other copy shadowing it).
    assert serialized_file(SHIPPED.read_text()) == pb.DESCRIPTOR.serialized_pb, STALE
    assert Path(pb.__file__).resolve() == SHIPPED


def test_shipped_type_stubs_are_current(generated: Path) -> None:
    fresh = (generated / "lowlat_v1_pb2.pyi").read_text()
    shipped = (PROTO_DIR / "lowlat_v1_pb2.pyi").read_text()
    assert fresh == shipped, STALE.replace("_pb2.py is", "_pb2.pyi is")


def test_python_error_codes_match_the_proto_enum() -> None:
    proto_values = {v.name: v.number for v in pb.DESCRIPTOR.enum_types_by_name["ErrorCode"].values}
    python_values = {("ERROR_CODE_UNSPECIFIED" if c is ErrorCode.UNSPECIFIED else c.name): int(c) for c in ErrorCode}
    assert python_values == proto_values


def test_stale_message_says_how_to_regenerate() -> None:
    assert REGENERATE in STALE


def test_the_wire_table_names_every_message_every_field_and_every_event() -> None:
    """wire/schema.py's table is the one place a message kind is added: it lists every member of the
    Envelope's oneof, each with exactly its message's fields, which are exactly its event class's fields."""
    import dataclasses
    from typing import get_args

    from lowlat_mw.protocol import events as ev
    from lowlat_mw.protocol.wire.schema import KINDS

    envelope = pb.Envelope.DESCRIPTOR
    assert [k.name for k in KINDS] and len({k.name for k in KINDS}) == len(KINDS)
    assert {k.name for k in KINDS} == {f.name for f in envelope.oneofs_by_name["msg"].fields}
    assert {k.cls for k in KINDS} == set(get_args(ev.Event))
    for kind in KINDS:
        message = envelope.fields_by_name[kind.name].message_type
        table = [f.name for f in kind.fields]
        assert len(set(table)) == len(table), kind.name
        assert set(table) == {f.name for f in message.fields}, kind.name
        assert set(table) == {f.name for f in dataclasses.fields(kind.cls)}, kind.name
        assert len(message.oneofs) <= 1, kind.name  # (the codec reads one oneof per message)
