"""How `python3 dev.py test` spreads the suite over pytest-xdist's processes (``--dist loadscope``).

xdist's loadscope sends each module to one process, because a module's servers are set up once per module. Two
kinds of tests share more than a module, and run in one process per group instead:

* tests/test_benchmarks*.py (12 modules) share the session fixture ``quick_bench``, one run of every benchmark
  suite (~50-80 s in two subprocesses). Spread by module, every process ran it: three runs at once at the end
  of the suite, in six subprocesses on two cores. As one unit, sent first, it runs once, beside the rest.
* tests/browser (3 modules) share the session fixture ``browser`` (a headless Chromium) and the background
  `npm install` of React: as one unit, sent second, one process starts them, once.
* tests/conformance share one server process per server name (the session fixtures ``server`` and
  ``timer_server``, parametrized by name). By module, each process ran each module for every server, and
  restarted each server for each module. Grouped by the server name in the test's id, each unit starts its
  servers once and the five servers' units run side by side, each starting at another module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xdist.scheduler import LoadScopeScheduling

__all__ = ["SuiteScheduling", "param_named"]

BENCHMARKS = "tests/test_benchmarks"
BROWSER = "tests/browser/"
CONFORMANCE = "tests/conformance/"
FIRST = ("benchmarks", "browser")  # units sent before all others, in this order: long, and few tests each


def param_named(nodeid: str, names: Iterable[str]) -> str | None:
    """The first of `names` among the dash-separated parameter ids of `nodeid` (``test_x[proto-django]``)."""
    if not nodeid.endswith("]") or "[" not in nodeid:
        return None
    wanted = set(names)
    return next((part for part in nodeid[nodeid.rindex("[") + 1:-1].split("-") if part in wanted), None)


class SuiteScheduling(LoadScopeScheduling):
    """loadscope, with the benchmark modules as one unit sent first and conformance tests grouped by server."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        from conformance_servers import FRAMEWORKS, SERVERS  # (tests/conformance is on pytest's pythonpath)

        self.server_names = (*FRAMEWORKS, *SERVERS)
        self.staggered = False

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(BENCHMARKS):
            return "benchmarks"
        if nodeid.startswith(BROWSER):
            return "browser"
        if nodeid.startswith(CONFORMANCE):
            server = param_named(nodeid, self.server_names)
            if server is not None:
                return f"conformance[{server}]"
        return super()._split_scope(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self.staggered:
            self.staggered = True
            self._stagger_conformance_units()
        for scope in reversed(FIRST):
            if scope in self.workqueue:
                self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)

    def _stagger_conformance_units(self) -> None:
        """Start each server's unit at a different module (the i-th of n units 1/n further on): in collection
        order every unit would run the same module at the same time, its load tests (200 sockets, 1,000
        streams) on every server at once. A unit's order of modules changes no fixture: its servers are
        session fixtures of its one server name."""
        units = sorted(scope for scope in self.workqueue if scope.startswith("conformance["))
        for i, scope in enumerate(units):
            unit = self.workqueue[scope]
            modules = list(dict.fromkeys(nodeid.split("::", 1)[0] for nodeid in unit))
            start = i * len(modules) // len(units)
            order = {module: rank for rank, module in enumerate(modules[start:] + modules[:start])}
            self.workqueue[scope] = dict(sorted(unit.items(), key=lambda kv: order[kv[0].split("::", 1)[0]]))
