"""A Flask app whose lowlat-mw config has a misspelt setting, or the mistakes in $BAD_SETTINGS (a JSON object):
startup must fail naming each."""

from __future__ import annotations

import json
import os

from flask import Flask

from lowlat_mw.adapters.flask import LowLat


def model(req):
    return "unreachable"


app = Flask(__name__)
app.config["LOWLAT_MW"] = json.loads(os.environ.get("BAD_SETTINGS", '{"idle_timout": 5}'))
LowLat(app, model=model)
