"""The house rules of docs/architecture.md, checked on the source: layers, the sans-IO protocol, one place
for each rule, and the length of one request's path (benchmarks/callpath.py).

Imports are read with `ast` (every import statement, at module level or inside a function), so a
rule broken by a lazy import fails too.
"""

from __future__ import annotations

import ast
import importlib.util
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


PROTOCOL = sorted((PACKAGE / "protocol").rglob("*.py"))


@pytest.mark.parametrize("path", PROTOCOL, ids=lambda p: p.relative_to(PACKAGE / "protocol").as_posix())
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


# ================================================================================ no reach into others' internals
# Issue 39: speed lives behind named seams (the wire fast path, the corking writer, servers/), never in tricks that an
# upgrade of Python, uvicorn or websockets breaks silently. Read on the source with `ast`, every file of lowlat_mw/
# and adapters/, lazy imports included.
SERVERS = PACKAGE / "servers"
FOREIGN = ("uvicorn", "websockets", "asyncio", "daphne", "twisted")  # whose private names only servers/ may use
FRAME_WALKS = {"gi_yieldfrom", "gi_frame", "gi_code", "cr_frame", "cr_await", "cr_code", "ag_frame", "ag_await"}
ALL_SOURCES = sorted([*PACKAGE.rglob("*.py"), *ADAPTERS.glob("*.py")])  # (the generated _pb2 modules too)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _private(name: str) -> bool:
    """A private name: one segment starts with an underscore (dunders such as ``__init__`` are not private)."""
    return any(s.startswith("_") and not (s.startswith("__") and s.endswith("__")) for s in name.split("."))


def _constant_arg(call: ast.Call, index: int) -> str | None:
    if len(call.args) > index and isinstance(call.args[index], ast.Constant) and type(call.args[index].value) is str:
        return call.args[index].value  # type: ignore[no-any-return]
    return None


def code_generation(tree: ast.Module) -> list[str]:
    """Calls that run or build code from text: ``exec``, ``eval``, ``compile`` (builtin, not ``re.compile``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in ("exec", "eval", "compile"):
                found.append(f"line {node.lineno}: {f.id}()")
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "builtins" \
                    and f.attr in ("exec", "eval", "compile"):
                found.append(f"line {node.lineno}: builtins.{f.attr}()")
    return found


def class_swaps(tree: ast.Module) -> list[str]:
    """Assignments to an object's ``__class__``: ``x.__class__ = C``, ``setattr(x, "__class__", C)`` and
    ``object.__setattr__(x, "__class__", C)``."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and sub.attr == "__class__":
                    found.append(f"line {node.lineno}: .__class__ = ...")
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ("setattr", "__setattr__") and "__class__" in (_constant_arg(node, 1), _constant_arg(node, 0)):
                found.append(f"line {node.lineno}: {name}(..., '__class__', ...)")
    return found


def foreign_private_reaches(tree: ast.Module) -> list[str]:
    """Private names of FOREIGN modules: imported (``from asyncio.tasks import _enter_task``, ``import
    websockets._x``, ``from uvicorn.protocols.websockets import _SansIOProtocol``), or reached by attribute from a
    name bound to one of their modules or objects (``asyncio.tasks._enter_task``, ``getattr(asyncio, "_x")``)."""
    found = []
    bound: set[str] = set()  # names this file binds to a FOREIGN module or one of its objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FOREIGN:
                    bound.add((alias.asname or alias.name).split(".")[0])
                    if _private(alias.name):
                        found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in FOREIGN:
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _private(f"{node.module}.{alias.name}"):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, root = [node.attr], node.value
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound and _private(".".join(chain)):
                found.append(f"line {node.lineno}: {root.id}...{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr") \
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in bound:
            name = _constant_arg(node, 1)
            if name is not None and _private(name):
                found.append(f"line {node.lineno}: {node.func.id}({node.args[0].id}, {name!r})")
    return found


def frame_walks(tree: ast.Module) -> list[str]:
    """Reads of a generator's or coroutine's frame and delegation (``gi_yieldfrom``, ``gi_frame``, ``cr_frame``...):
    where another library's generator waits is its own business."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FRAME_WALKS:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and _constant_arg(node, 1) in FRAME_WALKS:
            found.append(f"line {node.lineno}: {node.func.id}(..., {_constant_arg(node, 1)!r})")
    return found


def test_no_code_is_built_from_text_and_no_object_changes_its_class() -> None:
    offenders = {rel(p): code_generation(t) + class_swaps(t) for p in ALL_SOURCES for t in [parsed(p)]}
    assert not {k: v for k, v in offenders.items() if v}, "exec/eval/compile or a __class__ swap"


def test_no_private_name_of_a_server_websockets_or_asyncio_outside_servers() -> None:
    offenders = {rel(p): foreign_private_reaches(t) + frame_walks(t)
                 for p in ALL_SOURCES if not p.is_relative_to(SERVERS) for t in [parsed(p)]}
    assert not {k: v for k, v in offenders.items() if v}, "only lowlat_mw/servers/ may touch these"


# ---------------------------------------------------------------------------------------- module-level memos
MEMO_FOLDERS = (PACKAGE / "protocol", PACKAGE / "runtime")
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear", "remove",
            "discard", "appendleft", "extendleft", "popleft", "__setitem__", "__delitem__", "move_to_end"}
MUTABLE_CALLS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "deque", "Counter",
                 "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "ChainMap"}
# Module state that is not a memo: live objects of the process, each with the reason (name -> why).
REGISTRIES = {
    "lowlat_mw/runtime/threads.py": {
        "_loop": "the process's one background event loop thread for thread-based adapters, started on first use",
        "_send_pool": "the send threads beside that loop, started with it"},
    "lowlat_mw/runtime/push.py": {"HUB": "the process's push hub (Redis listener threads), replaced in a forked child"},
    "lowlat_mw/runtime/drain.py": {"_DRAINS": "the running drain task of each event loop (weak: goes with its loop)"},
    "lowlat_mw/runtime/writer.py": {"by_loop": "each event loop's Turns, the loop's write turns (weak, as above)"},
    "lowlat_mw/runtime/timers.py": {"by_loop": "each event loop's timer scheduler (weak, as above)"},
    "lowlat_mw/runtime/batch.py": {"_BATCHERS": "each loop's live Batchers: a batch gathers the requests of every "
                                                "connection of the loop, the sharing is its job (weak, as above)"},
    "lowlat_mw/runtime/shared.py": {"_by_loop": "each loop's live clients of the shared store (weak, as above)",
                                    "_process_id": "this process's id in the shared store, new in a forked child"},
    "lowlat_mw/runtime/eager.py": {"start": "the seam: the task starter lowlat_mw.servers.eager installs on Python "
                                            "3.11, once as the package is imported (a strategy, not a cache)"},
}


def _is_mutable_value(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        return (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "") in MUTABLE_CALLS
    return False


def _containers(body: list[ast.stmt]) -> set[str]:
    """Names bound to a mutable container by the statements of `body` (a module's or a class's)."""
    names = set()
    for stmt in body:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
            else []
        if _is_mutable_value(value):
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _held_name(node: ast.expr) -> str | None:
    """The module- or class-level name `node` reads: ``NAME``, ``cls.NAME``, ``Class.NAME`` (not ``self.NAME``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id != "self":
        return node.attr
    return None


def module_memos(tree: ast.Module) -> set[str]:
    """The module-level memos of a module. A memo is module (or class) state that functions change after import:

    - a name a function rebinds through a ``global`` statement;
    - a module-level or class-level name bound to a mutable container (a dict, list or set display or
      comprehension, or a call of dict, list, set, defaultdict, OrderedDict, deque, Counter, the weak containers...)
      that a function body mutates: item assignment or deletion (``NAME[k] = v``, ``del NAME[k]``, ``cls.NAME[k]
      += 1``) or a call of a mutating method (``NAME.setdefault(...)``, ``.append``, ``.update``, ``.pop``...);
    - a module-level function wrapped in ``functools.lru_cache`` or ``functools.cache``.

    A table built at import and only read after (a constant) is not a memo; neither is a mutation by module-level
    code (it runs once, at import). A name bound to state of the process that is not a cache of computed values
    (a background loop, a hub of listener threads) is listed in REGISTRIES with the reason.
    """
    found = set()
    containers = _containers(tree.body)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            containers |= _containers(node.body)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if (target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")) in (
                        "lru_cache", "cache"):
                    found.add(node.name)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for function in functions:
        for node in ast.walk(function):
            if isinstance(node, ast.Global):
                found |= set(node.names)
            subscripted = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                subscripted = [t.value for t in targets if isinstance(t, ast.Subscript)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                subscripted = [node.func.value]
            for held in subscripted:
                name = _held_name(held)
                if name in containers:
                    found.add(name)  # type: ignore[arg-type]
    return found


MEMO_SOURCES = sorted(p for folder in MEMO_FOLDERS for p in folder.rglob("*.py"))


@pytest.mark.parametrize("path", MEMO_SOURCES, ids=rel)
def test_no_module_level_mutable_memo_in_protocol_or_runtime(path: Path) -> None:
    allowed = set(REGISTRIES.get(rel(path), {}))
    assert module_memos(parsed(path)) <= allowed, "a module-level memo: state belongs to an object that owns it"


def test_the_listed_exceptions_are_still_there() -> None:
    # A registry that is gone leaves its entry behind: the list holds only what the code has.
    for listed in (REGISTRIES,):
        for name, names in listed.items():
            seen = module_memos(parsed(ROOT / name))
            assert set(names) <= seen, f"{name}: {set(names) - seen} no longer there: delete the entry"


# ================================================================================ the model runner's one path
RUNNER = [PACKAGE / "runtime" / name for name in ("streams.py", "sources.py", "finish.py")]


def test_every_chunk_goes_out_through_the_runners_one_emit_and_it_reads_no_private_attribute_of_another() -> None:
    """Issue 39: a stream is one pipeline (source -> shape -> emit -> finish). Every chunk the runner sends goes
    through one function (`ModelRunner._emit`), no written-out copy of it; and the runner asks the driver (fair
    scheduling: `writer.first_delta`), it does not read the driver's (or anyone's) private attributes."""
    senders, private = [], []
    for path in RUNNER:
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "chunk" \
                        and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "timer"):
                    senders.append(f"{path.name}:{fn.name}")
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    private.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert senders == ["streams.py:_emit"]
    assert private == []


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
