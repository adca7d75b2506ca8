"""The dialect seam (lowlat_mw/protocol/dialect.py): lowlat.v1's machine is a ServerMachine, the Protocol names every
member the runtime touches and no other, each with its docstring, and a Dialect picks its subprotocol."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from lowlat_mw.protocol.dialect import LOWLAT_V1, Dialect, ServerMachine, pick
from lowlat_mw.protocol.server import ServerProtocol
from lowlat_mw.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = typing._get_protocol_attrs(ServerMachine)  # type: ignore[attr-defined]
# Where the runtime reaches a connection's machine: `<x>.protocol.<member>`, or `proto.<member>` (proto = .protocol).
USERS = [*sorted((ROOT / "lowlat_mw" / "runtime").glob("*.py")), ROOT / "lowlat_mw" / "endpoint.py",
         *sorted((ROOT / "adapters").glob("*.py"))]


def test_server_protocol_is_a_server_machine() -> None:
    proto = ServerProtocol(Settings(), subprotocol=None, now=0.0, session_id="a", secret="b")
    assert isinstance(proto, ServerMachine)
    assert ServerProtocol.resumable
    for name in MEMBERS:  # each method takes what the Protocol says the runtime passes
        theirs = getattr(ServerMachine, name, None)
        if inspect.isfunction(theirs):
            mine = getattr(ServerProtocol, name)
            wanted = list(inspect.signature(theirs).parameters)
            assert list(inspect.signature(mine).parameters)[:len(wanted)] == wanted, name


def test_a_machine_factory_is_what_the_driver_calls() -> None:
    made = LOWLAT_V1.machine(Settings(), subprotocol="lowlat.v1.json", now=5.0, session_id="s", secret="t",
                             meter=None, heartbeats=None)
    assert type(made) is ServerProtocol and made.session_id == "s"
    assert made.next_deadline() == 5.0 + Settings().handshake_timeout  # the driver's first timer: the handshake


def test_the_runtime_touches_nothing_of_a_machine_but_the_protocol() -> None:
    used: dict[str, str] = {}
    for path in USERS:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            on = node.value
            if (isinstance(on, ast.Attribute) and on.attr == "protocol") or (isinstance(on, ast.Name)
                                                                              and on.id == "proto"):
                used.setdefault(node.attr, f"{path.name}:{node.lineno}")
    assert {"receive_data", "send_chunk", "finish_stream", "tick", "pong_frame"} <= set(used)  # (the scan sees them)
    outside = {name: where for name, where in used.items() if name not in MEMBERS}
    assert outside == {}, "the runtime uses machine members the ServerMachine Protocol does not name"
    unused = set(MEMBERS) - set(used) - {"closed", "resumable"}  # (read as driver.protocol.closed; in closing.py)
    assert unused <= {"drain", "join", "push", "refuse_input", "authenticated", "resume", "close", "connection_lost",
                      "deadline_seen", "next_deadline", "heartbeat", "ping_made", "pong_arrived", "compressor"}


def test_every_member_of_the_protocol_has_a_one_line_docstring() -> None:
    source = (ROOT / "lowlat_mw" / "protocol" / "dialect.py").read_text()
    cls = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "ServerMachine")
    documented = set()
    for i, node in enumerate(cls.body):
        if isinstance(node, ast.FunctionDef):
            doc = ast.get_docstring(node)
            if doc and "\n" not in doc:
                documented.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            after = cls.body[i + 1] if i + 1 < len(cls.body) else None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and "\n" not in after.value.value:
                documented.add(node.target.id)
    assert set(MEMBERS) == documented


class _Minimal(ServerMachine):
    """A dialect's machine that implements only what the Protocol does not default."""

    def __init__(self, settings: Settings, **ids: typing.Any) -> None:
        from lowlat_mw.protocol.base import FrameStats
        from lowlat_mw.protocol.state import ConnState

        self.state, self.session_id, self.session, self.subprotocol = ConnState.OPEN, ids["session_id"], None, None
        self.stats, self.close_code, self.close_reason, self.deadline_moved = FrameStats("minimal"), None, "", False

    def receive_data(self, data: bytes | str, now: float) -> list[typing.Any]:
        return []

    def send_chunk(self, stream_id: int, chunk: typing.Any, now: float) -> list[bytes | str]:
        return []

    def finish_stream(self, stream_id: int, now: float, **ending: typing.Any) -> list[typing.Any]:
        return []

    def tick(self, now: float) -> list[typing.Any]:
        return []

    def next_deadline(self, answered: bool = False) -> float:
        return float("inf")


def test_a_minimal_machine_inherits_the_defaults() -> None:
    from lowlat_mw.protocol.base import CloseConnection

    m = _Minimal(Settings(), session_id="x")
    assert isinstance(m, ServerMachine)
    assert (m.pong_frame, m.compressor, m.heartbeat, m.principal) == (None, None, None, None)
    assert not m.resumable and not m.resumed and m.compression == ()
    assert m.drain() == [] and m.push("t", "b") is None and m.join("g", True, 0.0) == []
    assert m.close(4000, "idle") == [CloseConnection(4000, "idle")] and m.closed and m.close() == []
    m.deadline_moved = True
    m.deadline_seen()
    assert not m.deadline_moved


@pytest.mark.parametrize(("offered", "accepted", "chosen"), [
    ((), True, None), (("x.v1",), True, "x.v1"), (("other", "x.v1"), True, "x.v1"), (("other",), False, None)])
def test_a_dialect_picks_its_subprotocol(offered: tuple[str, ...], accepted: bool, chosen: str | None) -> None:
    dialect = Dialect("x", _Minimal, ("x.v1",))
    assert dialect.choose(offered, Settings()) == (accepted, chosen)


def test_pick_takes_the_first_dialect_at_a_path_that_accepts_the_offer() -> None:
    x = Dialect("x", _Minimal, ("x.v1",))
    settings = Settings()
    assert pick([x, LOWLAT_V1], ("lowlat.v1.proto",), settings) is LOWLAT_V1
    assert pick([x, LOWLAT_V1], ("x.v1",), settings) is x
    assert pick([x, LOWLAT_V1], (), settings) is x  # (both accept none: the first listed)
    assert pick([LOWLAT_V1, x], ("nothing",), settings) is LOWLAT_V1  # (none accepts: the first, and admit refuses)
