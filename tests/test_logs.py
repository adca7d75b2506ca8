"""LogBudget: the lines a client can cause, bounded per client address (a fake clock)."""

from __future__ import annotations

import logging

import pytest

from lowlat_mw.observability.logs import LogBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records]


@pytest.fixture
def logger(caplog: pytest.LogCaptureFixture) -> logging.Logger:
    caplog.set_level(logging.DEBUG, logger="test.logs")
    return logging.getLogger("test.logs")


def test_the_first_lines_of_a_key_pass_then_the_rest_go_to_debug(logger: logging.Logger,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    budget = LogBudget(burst=3, window=60, clock=Clock())
    for i in range(10):
        budget.log(logger, logging.WARNING, "10.0.0.1", "bad frame %d", i)
    levels = [level for level, _ in records(caplog)]
    assert levels == [logging.WARNING] * 3 + [logging.DEBUG] * 7  # nothing is lost at DEBUG
    assert [m for _, m in records(caplog)][3] == "bad frame 3"


def test_keys_have_budgets_of_their_own(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    budget = LogBudget(burst=1, window=60, clock=Clock())
    for key in ("a", "b", "a", "b", "c"):
        budget.log(logger, logging.INFO, key, "from %s", key)
    assert records(caplog) == [(logging.INFO, "from a"), (logging.INFO, "from b"), (logging.DEBUG, "from a"),
                               (logging.DEBUG, "from b"), (logging.INFO, "from c")]


def test_the_next_window_says_how_many_were_held_back(logger: logging.Logger,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    budget = LogBudget(burst=2, window=60, clock=clock)
    for _ in range(7):
        budget.log(logger, logging.INFO, "10.0.0.1", "bad")
    clock.now += 59.9
    budget.log(logger, logging.INFO, "10.0.0.1", "bad")  # still the first window: held back too
    clock.now += 0.1
    budget.log(logger, logging.INFO, "10.0.0.1", "bad")
    budget.log(logger, logging.INFO, "10.0.0.1", "bad")
    assert records(caplog)[-2:] == [(logging.INFO, "bad (6 similar from 10.0.0.1 held back in the last 60 s)"),
                                    (logging.INFO, "bad")]


def test_an_address_scan_does_not_grow_the_budget_without_bound(logger: logging.Logger) -> None:
    budget = LogBudget(burst=1, window=60, max_keys=100, clock=Clock())
    for i in range(10_000):
        budget.log(logger, logging.INFO, f"10.0.{i // 256}.{i % 256}", "x")
    assert len(budget._keys) <= 100


def test_arguments_and_extra_reach_the_record(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    LogBudget(clock=Clock()).log(logger, logging.WARNING, "k", "refused %s: %s", "10.0.0.1", "limit",
                                 extra={"client": "10.0.0.1"})
    [record] = caplog.records
    assert record.getMessage() == "refused 10.0.0.1: limit" and record.client == "10.0.0.1"  # type: ignore[attr-defined]
