"""tests/support: the time unit, the bounded waits, and how the suite is spread over xdist's processes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from support.scheduling import SuiteScheduling, param_named
from support.time import _scale, seconds
from support.waits import wait_for, wait_until, wait_until_sync
from xdist.scheduler import LoadScopeScheduling


def test_the_time_scale_defaults_to_one_and_reads_the_environment() -> None:
    assert _scale({}) == 1.0
    assert _scale({"LOWLAT_TEST_TIME_SCALE": " 2.5 "}) == 2.5
    for bad in ("fast", "0", "-1", "nan"):
        with pytest.raises(ValueError, match="LOWLAT_TEST_TIME_SCALE"):
            _scale({"LOWLAT_TEST_TIME_SCALE": bad})


def test_seconds_is_the_bound_itself_at_scale_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import support.time

    assert seconds(0.3) == 0.3 * support.time.TIME_SCALE
    monkeypatch.setattr(support.time, "TIME_SCALE", 3.0)
    assert seconds(0.5) == 1.5


async def test_wait_until_returns_the_value_once_true_and_fails_saying_what_it_waited_for() -> None:
    calls = iter([0, [], "ready"])
    assert await wait_until(lambda: next(calls), 5.0, interval=0.001) == "ready"
    with pytest.raises(AssertionError, match="the impossible"):
        await wait_until(lambda: False, 0.05, interval=0.001, what="the impossible")
    with pytest.raises(AssertionError, match="the impossible"):
        wait_until_sync(lambda: False, 0.05, interval=0.001, what="the impossible")


async def test_wait_for_takes_either_kind_of_event() -> None:
    loop_event, thread_event = asyncio.Event(), threading.Event()
    asyncio.get_running_loop().call_soon(loop_event.set)
    threading.Timer(0.01, thread_event.set).start()
    await wait_for(loop_event, 5.0)
    await wait_for(thread_event, 5.0)
    started = time.monotonic()
    with pytest.raises(AssertionError, match="never"):
        await wait_for(asyncio.Event(), 0.05, what="never")
    assert time.monotonic() - started < 5.0


def test_param_named_finds_a_name_among_the_parameter_ids() -> None:
    names = ("starlette", "django")
    assert param_named("tests/conformance/test_x.py::test_a[proto-django]", names) == "django"
    assert param_named("tests/conformance/test_x.py::test_a[starlette]", names) == "starlette"
    assert param_named("tests/conformance/test_x.py::test_a[proto]", names) is None
    assert param_named("tests/conformance/test_x.py::test_a", names) is None


def test_the_scheduling_groups_benchmarks_and_conformance_servers_and_keeps_modules_otherwise() -> None:
    sched = object.__new__(SuiteScheduling)  # (only the grouping rule: no xdist session needed)
    sched.server_names = ("starlette", "django", "wsproto")
    split = sched._split_scope
    assert split("tests/test_benchmarks_bare.py::test_a") == split("tests/test_benchmarks.py::test_b") == "benchmarks"
    assert split("tests/browser/test_browser.py::test_a") == split("tests/browser/test_browser_push.py::b") == "browser"
    assert split("tests/conformance/test_conformance_limits.py::test_a[django-proto]") == "conformance[django]"
    assert split("tests/conformance/test_conformance_cancel.py::test_b[django]") == "conformance[django]"
    django = "tests/conformance/test_conformance_django.py"
    assert split(f"{django}::test_c") == django
    assert split("tests/test_codec.py::test_d[django]") == "tests/test_codec.py"
    assert split("tests/test_codec.py::TestX::test_e") == "tests/test_codec.py::TestX"


def test_the_servers_units_start_at_different_modules() -> None:
    from collections import OrderedDict

    sched = object.__new__(SuiteScheduling)
    modules = [f"tests/conformance/test_conformance_{m}.py" for m in ("a", "b", "c", "d")]
    sched.workqueue = OrderedDict(
        (f"conformance[{server}]", {f"{m}::test_{k}[{server}]": False for m in modules for k in (1, 2)})
        for server in ("django", "starlette"))
    sched._stagger_conformance_units()
    first = {scope: next(iter(unit)).split("::")[0] for scope, unit in sched.workqueue.items()}
    assert first == {"conformance[django]": modules[0], "conformance[starlette]": modules[2]}
    for unit in sched.workqueue.values():
        assert len(unit) == 8
        assert [n.split("::")[1][:6] for n in unit][:2] == ["test_1", "test_2"]  # a module's own order kept


def test_the_benchmarks_unit_goes_first_then_the_browsers(monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import OrderedDict

    sched = object.__new__(SuiteScheduling)
    sched.staggered, sent = True, []
    sched.workqueue = OrderedDict((scope, {}) for scope in ("tests/test_codec.py", "browser", "benchmarks", "x"))
    # (xdist's own assignment, which sends the unit at the head of the queue: here only its name is kept)
    monkeypatch.setattr(LoadScopeScheduling, "_assign_work_unit",
                        lambda self, node: sent.append(self.workqueue.popitem(last=False)[0]))
    for _ in range(3):
        sched._assign_work_unit(None)
    assert sent == ["benchmarks", "browser", "tests/test_codec.py"]
