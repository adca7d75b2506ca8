"""Each guide's "Test" section, run as a user runs it: the guide's test module, verbatim, with pytest in a new
process, pytest-asyncio at its defaults (strict mode) and only what the guide's install brings (issue 38).

The user's app is the smallest one the guide describes, with a model that answers "..." (what the guides' tests
expect). Packages the guide's extra does not install are refused in the child (tests/blocked_imports.py).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from blocked_imports import not_in_extra, python_without
from guide_support import guide_block

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = 'async def generate(req):\n    yield "..."\n'

FASTAPI_APP = MODEL + '''
from fastapi import FastAPI
from lowlat_mw.adapters.starlette import LowLatMiddleware

app = FastAPI()
app.add_middleware(LowLatMiddleware, model=generate, path="/ws")
'''

FLASK_APP = MODEL.replace("async def", "def") + '''
from flask import Flask
from lowlat_mw.adapters.flask import LowLat

app = Flask(__name__)
app.config["LOWLAT_MW"] = {"path": "/ws"}
lowlat = LowLat(app, model=generate)
'''

DJANGO_SETTINGS = '''
SECRET_KEY = "guide-test-only"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
INSTALLED_APPS = ["daphne", "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
                  "channels", "myapp"]
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"  # (no database to migrate)
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "mysite.urls"
ASGI_APPLICATION = "mysite.asgi.application"
USE_TZ = True
'''


def _project(framework: str, root: Path) -> None:
    """The user's app: a FastAPI or Flask `myapp.py`, or a Django project from the guide's routing.py and asgi.py."""
    if framework == "starlette":
        (root / "myapp.py").write_text(FASTAPI_APP)
    elif framework == "flask":
        (root / "myapp.py").write_text(FLASK_APP)
    else:
        for package in ("mysite", "myapp"):
            (root / package).mkdir()
            (root / package / "__init__.py").write_text("")
        (root / "mysite" / "settings.py").write_text(DJANGO_SETTINGS)
        (root / "mysite" / "urls.py").write_text("urlpatterns = []\n")
        (root / "mysite" / "asgi.py").write_text(guide_block("django.md", "# asgi.py"))
        (root / "myapp" / "routing.py").write_text(guide_block("django.md", "# routing.py"))
        (root / "myapp" / "ai.py").write_text(MODEL)


GUIDES = {"starlette": ("starlette.md", "fastapi"), "django": ("django.md", "django"), "flask": ("flask.md", "flask")}


@pytest.mark.parametrize("framework", sorted(GUIDES))
def test_the_guides_tests_pass_as_written(framework: str, tmp_path: Path) -> None:
    guide, extra = GUIDES[framework]
    tests = guide_block(guide, "import pytest", "def lowlat_app")
    _project(framework, tmp_path)
    (tmp_path / "test_guide.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # pytest-asyncio's defaults: strict mode
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOWLAT_", "PYTEST_")) and k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    code = "import sys\nimport pytest\nsys.exit(pytest.main())\n"
    result = subprocess.run([*python_without(not_in_extra(extra), code), "-p", "asyncio", "-p", "no:cacheprovider",
                             "-q", "-rA", "test_guide.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=110)
    output = result.stdout + result.stderr
    written = re.findall(r"^(?:async )?def (test_\w+)", tests, re.M)
    assert written, tests
    assert result.returncode == 0, output
    for name in written:
        assert f"PASSED test_guide.py::{name}" in output, (name, output)
    assert re.search(rf"\b{len(written)} passed\b", output) and "skipped" not in output, output


def test_the_served_fixtures_without_uvicorn_say_what_to_install() -> None:
    code = ("from lowlat_mw.testing.pytest_plugin import RunningServer\n"
            "async def app(scope, receive, send): ...\n"
            "RunningServer(app).start()\n")
    result = subprocess.run(python_without({"uvicorn", "httptools", "uvloop"}, code), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "ImportError: lowlat_server serves ASGI apps in uvicorn, which is not installed" in result.stderr, \
        result.stderr
    assert "pip install 'lowlat-mw[serve]'" in result.stderr, result.stderr
