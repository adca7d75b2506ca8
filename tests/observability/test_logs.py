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
    assert records(caplog)[-2:] == [(logging.INFO, "bad (6 more from 10.0.0.1 held back at DEBUG)"),
                                    (logging.INFO, "bad")]


def test_the_connections_of_one_address_share_its_budget(logger: logging.Logger,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The key is the address: the lines of 100 connections from one address (each from another port) are 3."""
    budget = LogBudget(burst=3, window=60, clock=Clock())
    for port in range(40000, 40100):
        budget.log(logger, logging.INFO, "10.0.0.1", "bad frame from %s:%d", "10.0.0.1", port)
    assert [level for level, _ in records(caplog)] == [logging.INFO] * 3 + [logging.DEBUG] * 97


def test_every_address_together_has_a_budget_too(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    """An attacker with many addresses gets `total` lines a window at their level, not `burst` per address; the
    first line let through in the next window says how many were held back."""
    clock = Clock()
    budget = LogBudget(burst=2, window=60, total=5, clock=clock)
    for i in range(20):
        budget.log(logger, logging.WARNING, f"10.0.0.{i}", "refused %s", i)
    assert [level for level, _ in records(caplog)] == [logging.WARNING] * 5 + [logging.DEBUG] * 15
    clock.now += 60
    budget.log(logger, logging.WARNING, "10.0.0.99", "refused %s", 99)
    assert records(caplog)[-1] == (logging.WARNING, "refused 99 (15 more from all clients held back at DEBUG: "
                                                    "over 5 lines in 60 s)")


def test_what_was_held_back_is_told_on_the_next_line_let_through(logger: logging.Logger,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A count is never lost to a line that is itself held back: it waits for one that goes out."""
    clock = Clock()
    budget = LogBudget(burst=1, window=60, total=1, clock=clock)
    budget.log(logger, logging.INFO, "a", "x")
    budget.log(logger, logging.INFO, "a", "x")  # held: a's budget
    clock.now += 60
    budget.log(logger, logging.INFO, "b", "x")
    budget.log(logger, logging.INFO, "a", "x")  # held: the budget of all (a's count waits)
    clock.now += 60
    budget.log(logger, logging.INFO, "a", "x")
    assert records(caplog) == [(logging.INFO, "x"), (logging.DEBUG, "x"), (logging.INFO, "x"), (logging.DEBUG, "x"),
                               (logging.INFO, "x (1 more from a held back at DEBUG) (1 more from all clients held "
                                              "back at DEBUG: over 1 lines in 60 s)")]


def test_an_address_with_a_percent_sign_is_no_format_string(logger: logging.Logger,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    budget = LogBudget(burst=1, window=60, clock=clock)
    for _ in range(2):
        budget.log(logger, logging.INFO, "fe80::1%eth0", "100% bad")
    clock.now += 60
    budget.log(logger, logging.INFO, "fe80::1%eth0", "100% bad")
    assert records(caplog)[-1] == (logging.INFO, "100% bad (1 more from fe80::1%eth0 held back at DEBUG)")


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
