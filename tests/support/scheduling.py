"""How `python3 dev.py test` spreads the suite over pytest-xdist's processes (``--dist loadscope``).

xdist's loadscope sends each module to one process, because a module's servers are set up once per module. Two
kinds of tests share more than a module, and run in one process per group instead:

* tests/test_benchmarks*.py (12 modules) share the session fixture ``quick_bench``, one run of every benchmark
  suite (~50-80 s in two subprocesses). Spread by module, every process ran it: three runs at once at the end
  of the suite, in six subprocesses on two cores. As one unit, sent first, it runs once, beside the rest.
* tests/conformance share one server process per server name (the session fixtures ``server`` and
  ``timer_server``, parametrized by name). By module, each process ran each module for every server, and
  restarted each server for each module. Grouped by the server name in the test's id, each unit starts its
  servers once and the five servers' units run side by side.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from xdist.scheduler import LoadScopeScheduling

__all__ = ["SuiteScheduling", "param_named"]

BENCHMARKS = "tests/test_benchmarks"
CONFORMANCE = "tests/conformance/"
FIRST = ("benchmarks",)  # units sent before all others: the longest, which would otherwise end the run


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

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(BENCHMARKS):
            return "benchmarks"
        if nodeid.startswith(CONFORMANCE):
            server = param_named(nodeid, self.server_names)
            if server is not None:
                return f"conformance[{server}]"
        return super()._split_scope(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        for scope in FIRST:
            if scope in self.workqueue:
                self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)
