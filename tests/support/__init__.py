"""What the tests share: one time unit (time), bounded waits (waits), loopback ports (ports).

tests/ is on sys.path (pyproject's pytest ``pythonpath``), so a test imports ``from support import ...``.
"""

from support.ports import bind_loopback, free_port, wait_listening
from support.time import MARGIN, TIME_SCALE, WAIT, seconds
from support.waits import wait_for, wait_until, wait_until_sync

__all__ = ["MARGIN", "TIME_SCALE", "WAIT", "bind_loopback", "free_port", "seconds", "wait_for", "wait_listening",
           "wait_until", "wait_until_sync"]
