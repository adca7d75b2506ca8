"""The house rules of docs/architecture.md, checked on the source: layers, the sans-IO protocol, one place
for each rule, and the length of one request's path (benchmarks/callpath.py).

Imports are read with `ast` (every import statement, at module level or inside a function), so a
rule broken by a lazy import fails too.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lowlat_mw"
ADAPTERS = ROOT / "adapters"

# Each layer may import its own and the layers below it (docs/architecture.md, "Layers").
LAYERS = {
    "lowlat_mw._version": 0, "lowlat_mw.errors": 0, "lowlat_mw.settings": 0, "lowlat_mw.proto": 0, "lowlat_mw._fast": 0,
    "lowlat_mw.protocol": 1, "lowlat_mw.protocol.context": 1,
    "lowlat_mw.observability": 2,
    "lowlat_mw.model": 3, "lowlat_mw.security": 3, "lowlat_mw.static_files": 3, "lowlat_mw.endpoint": 3,
    "lowlat_mw.demo": 3, "lowlat_mw.docs": 3, "lowlat_mw.asyncapi": 3, "lowlat_mw.cache": 3,
    "lowlat_mw.runtime": 4,
    "lowlat_mw.client": 5, "lowlat_mw.testing": 5,
    "lowlat_mw.servers": 6, "lowlat_mw.testing.pytest_plugin": 6,
    "lowlat_mw.adapters": 7,
    "lowlat_mw": 8,  # the package itself: the public API, re-exported
}
# What the protocol layer may not import: nothing that does I/O, reads a clock, draws randomness or runs
# concurrently, and no web framework or server.
NOT_IN_PROTOCOL = {"asyncio", "socket", "select", "selectors", "ssl", "threading", "_thread", "multiprocessing",
                   "concurrent", "subprocess", "time", "datetime", "secrets", "random", "os", "uuid", "logging",
                   "starlette", "fastapi", "django", "channels", "flask", "flask_sock", "simple_websocket",
                   "werkzeug", "uvicorn", "daphne", "gunicorn", "websockets", "wsproto", "prometheus_client",
                   "opentelemetry"}


def module_name(path: Path) -> str:
    if path.is_relative_to(ADAPTERS):
        parts = ["lowlat_mw", "adapters", *path.relative_to(ADAPTERS).with_suffix("").parts]
    else:
        parts = ["lowlat_mw", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[str]:
    """Every module `path` imports, absolute, anywhere in the file (`from pkg import mod` counts as pkg.mod)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append(sub if sub.startswith("lowlat_mw") and _is_module(sub) else target)
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def layer_of(name: str) -> int | None:
    best = None
    for prefix in LAYERS:
        if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > len(best)):
            best = prefix
    return LAYERS[best] if best is not None else None


SOURCES = sorted(p for p in [*PACKAGE.rglob("*.py"), *ADAPTERS.glob("*.py")] if not p.name.endswith("_pb2.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_layer_imports_only_itself_and_the_layers_below(path: Path) -> None:
    me = module_name(path)
    mine = layer_of(me)
    assert mine is not None, f"{me} belongs to no layer: add it to LAYERS (and docs/architecture.md)"
    for target in imports(path):
        theirs = layer_of(target)
        if theirs is None:
            continue  # not ours
        assert theirs <= mine, f"{me} (layer {mine}) imports {target} (layer {theirs}): a lower layer may not"


PROTOCOL = sorted((PACKAGE / "protocol").glob("*.py"))


@pytest.mark.parametrize("path", PROTOCOL, ids=lambda p: p.name)
def test_the_protocol_layer_is_sans_io(path: Path) -> None:
    for target in imports(path):
        top = target.split(".")[0]
        assert top not in NOT_IN_PROTOCOL, f"protocol/{path.name} imports {target}"


def test_the_protocol_layer_does_no_io_by_its_calls_either() -> None:
    # A clock, ids or output could also come without an import (a builtin): the machines only see what their
    # callers pass in.
    for path in PROTOCOL:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("open", "print", "input", "exec", "eval", "__import__"), (
                    f"protocol/{path.name} calls {node.func.id}()")
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("perf_counter", "monotonic", "thread_time", "time_ns", "token_urlsafe",
                                         "token_bytes", "urandom", "get_running_loop", "create_task"), (
                    f"protocol/{path.name} uses .{node.attr}")


def sources_of(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.py"))}


def test_admission_is_the_endpoints_alone() -> None:
    # Subprotocol, Origin, drain state and limits are decided by Endpoint.admit: no adapter, driver or server
    # has a copy of any of them, nor of the close codes they answer with.
    rules = ("negotiate_subprotocol", "origin_allowed", "ConnectionLimiter", "handshakes_refused", "check_handshake",
             "TRY_AGAIN_LATER", "1013", "DRAINING")
    outside = {**{f"adapters/{k}": v for k, v in sources_of(ADAPTERS).items()},
               **{f"runtime/{k}": v for k, v in sources_of(PACKAGE / "runtime").items()},
               **{f"servers/{k}": v for k, v in sources_of(PACKAGE / "servers").items()}}
    for name, text in outside.items():
        for rule in rules[:5]:
            assert rule not in text, f"{name} mentions {rule}: admission is lowlat_mw.endpoint's"
        if name.startswith("adapters/"):
            for code in rules[5:]:
                assert code not in text, f"{name} mentions {code}: the Endpoint's refusal carries the close code"
    endpoint = (PACKAGE / "endpoint.py").read_text()
    assert "def admit(" in endpoint and "handshakes_refused" in endpoint
    for adapter in ("flask.py", "channels.py"):
        assert ".admit(" in (ADAPTERS / adapter).read_text() or "accept(" in (ADAPTERS / adapter).read_text()


def test_settings_from_framework_config_are_read_once() -> None:
    defining = [p for p in [*PACKAGE.rglob("*.py"), *ADAPTERS.glob("*.py")]
                if "def settings_from_config(" in p.read_text()]
    assert [p.relative_to(ROOT).as_posix() for p in defining] == ["lowlat_mw/endpoint.py"]
    for adapter in ("flask.py", "channels.py"):
        text = (ADAPTERS / adapter).read_text()
        assert "settings_from_config(" in text
        assert "Settings.load(" not in text and "Settings.names(" not in text and "SettingsError" not in text


def test_one_registry_of_connections_and_one_drain() -> None:
    # The connections of the process are Endpoint.instances and each Endpoint's connections; every drain
    # (drain_all for a server's shutdown, Endpoint.drain for an app, drain_all_sync for threads) goes
    # through Endpoint.drain_each.
    weak_sets = [p.relative_to(ROOT).as_posix() for p in [*PACKAGE.rglob("*.py"), *ADAPTERS.glob("*.py")]
                 if "WeakSet" in p.read_text()]
    # (the metrics' WeakSet holds open connections' frame counters, read at scrape time: no connection)
    assert weak_sets == ["lowlat_mw/endpoint.py", "lowlat_mw/observability/metrics.py"]
    assert "WeakSet[FrameStats]" in (PACKAGE / "observability" / "metrics.py").read_text()
    runtime = "".join(sources_of(PACKAGE / "runtime").values())
    assert runtime.count("Endpoint.drain_each(") == 1
    assert "await self.drain_each(" in (PACKAGE / "endpoint.py").read_text()
    assert "drain_all(" in (PACKAGE / "runtime" / "threads.py").read_text()
    for server in ("uvicorn.py", "daphne.py", "gunicorn.py", "serving.py"):
        text = (PACKAGE / "servers" / server).read_text()
        assert "drain_all" in text or "drain_on_shutdown" in text, server
    for name, text in sources_of(ADAPTERS).items():  # the adapters have no drain of their own
        assert "def drain" not in text and "draining" not in text and "drain_each" not in text, name


# ================================================================================ one request's path
# benchmarks/callpath.py on the Starlette middleware, default settings (metrics, stage timings, tracing on).
# Before the runtime of issue 14 (commit fa8ccdd), measured the same way: the request 125 functions and 140
# hand-offs between files, the connection 140 and 159. The budget: at most half.
BEFORE = {"request": (125, 140), "connection": (140, 159)}


@pytest.mark.parametrize("span", ["request", "connection"])
def test_one_request_touches_at_most_half_the_functions_and_hand_offs_of_before(span: str) -> None:
    # In a process of its own: what other tests left behind (an OpenTelemetry SDK provider) would count too.
    args = [sys.executable, "-m", "benchmarks.callpath", "--counts"]
    if span == "connection":
        args.append("--connection")
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith("LOWLAT_")})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    functions, handoffs = BEFORE[span]
    assert seen["functions"] <= functions // 2, seen
    assert seen["handoffs"] <= handoffs // 2, seen


def test_the_driver_never_writes_a_machines_state() -> None:
    # State has one owner (issue 39): the runtime calls the machines' methods (deadline_seen, belongs_to, rejoin,
    # take_journal, StreamState.move...), it never assigns an attribute of a ServerProtocol, Session, StreamState,
    # Heartbeat or IdleReaper.
    import dataclasses

    from lowlat_mw.protocol.heartbeat import Heartbeat, IdleReaper
    from lowlat_mw.protocol.server import ServerProtocol
    from lowlat_mw.protocol.session import Session, StreamState
    from lowlat_mw.settings import Settings

    proto = ServerProtocol(Settings(), subprotocol=None, now=0.0, session_id="a", secret="b")
    names = (set(vars(proto)) | set(vars(Session(Settings(), now=0.0, session_id="a", secret="b")))
             | {f.name for f in dataclasses.fields(StreamState)} | set(Heartbeat.__slots__) | set(IdleReaper.__slots__))
    writes = []
    for path in sorted((PACKAGE / "runtime").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            for target in targets:
                for el in target.elts if isinstance(target, ast.Tuple) else [target]:
                    el = el.value if isinstance(el, ast.Subscript) else el
                    if (isinstance(el, ast.Attribute) and el.attr in names
                            and not (isinstance(el.value, ast.Name) and el.value.id == "self")):
                        writes.append(f"{path.name}:{node.lineno} {ast.unparse(el)}")
    assert writes == []
