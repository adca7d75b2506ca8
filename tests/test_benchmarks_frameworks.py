"""The frameworks suite runs in quick mode against the four example apps and writes its section.

Starts uvicorn (Starlette, FastAPI), daphne (Django Channels) and gunicorn (Flask) as child process
groups; seconds, numbers meaningless. No timing assertions: the benchmark reports the comparison
(docs/benchmarks.md), unit tests only check that it runs and reports every row.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder of the repository, not installed
    sys.path.insert(0, str(ROOT))

from benchmarks._frameworks_servers import FRAMEWORKS, server_argv, server_env  # noqa: E402
from benchmarks.frameworks import HEADING, LABELS  # noqa: E402

COLUMNS = {"deltas_per_s", "deltas_ratio", "ttfd_p50_ms", "ttfd_p99_ms", "ttfd_p50_ratio", "ttfd_p99_ratio",
           "rt_p50_us", "rt_p99_us", "rt_p50_ratio", "rt_p99_ratio", "rt_end_p50_us", "rt_end_p99_us",
           "server_ttfd_p50_ms", "server_ttfd_p99_ms",
           "server_cpu_us_per_delta", "server_cpu_ratio", "client_cpu_us_per_delta"}


@pytest.mark.integration
@pytest.mark.timeout(600)  # the first test to ask for quick_bench runs every suite
def test_frameworks_suite_quick_writes_every_row(quick_bench: Any) -> None:
    result = quick_bench.results["frameworks"]

    assert set(result.rows) == set(FRAMEWORKS)
    for fw in FRAMEWORKS:
        assert set(result.rows[fw]) == COLUMNS
        for col, value in result.rows[fw].items():
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (fw, col, value)
    ref = result.rows["starlette"]
    assert ref["deltas_ratio"] == ref["ttfd_p50_ratio"] == ref["rt_p50_ratio"] == ref["server_cpu_ratio"] == 1.0
    assert set(result.plots) == {"frameworks.png"}

    text = quick_bench.text
    assert "intro kept" in text and "## Transport: kept" in text and "other suite's table" in text
    assert text.count(f"## {HEADING}") == 1
    section = quick_bench.section(HEADING)
    assert "Machine: " in section and "CPUs" in section and "--suite frameworks" in section
    for fw in FRAMEWORKS:
        assert section.count(f"| {LABELS[fw]} |") == 2  # streaming and round-trip tables
    assert "uvicorn examples.starlette_app:app" in section and "daphne" in section and "gunicorn -k gthread" in section
    assert "**Verdict**" in section and "no numeric target" in section


def test_server_command_lines_and_environment(tmp_path: Path) -> None:
    assert server_argv("starlette", 9)[1:] == ["examples.starlette_app:app", "--host", "127.0.0.1", "--port", "9",
                                               "--ws", "websockets-sansio"]
    assert server_argv("django", 9)[-1] == "examples.django_project.asgi:application"
    assert "gthread" in server_argv("flask", 9) and "127.0.0.1:9" in server_argv("flask", 9)
    with pytest.raises(ValueError):
        server_argv("bottle", 9)
    env = server_env(tmp_path)
    assert env["LOWLAT_MODEL"] == "benchmarks._bare_models:MODELS" and env["LOWLAT_RATE_LIMIT"] == "0"
    assert env["PYTHONPATH"] == str(ROOT) and env["DJANGO_DB"].startswith(str(tmp_path))
    assert "DJANGO_SETTINGS_MODULE" not in env


async def test_models() -> None:
    from benchmarks._bare_models import MODELS, TOKEN

    class Req:
        params = {"n": 130}
        text = "hi"

    assert [t async for t in MODELS["tokens"](Req())] == [TOKEN] * 130
    assert await MODELS["echo"](Req()) == "hi"
