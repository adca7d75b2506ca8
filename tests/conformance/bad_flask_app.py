"""A Flask app whose lowlat-mw config has a misspelt setting (startup must fail naming it)."""

from __future__ import annotations

from flask import Flask

from lowlat_mw.adapters.flask import LowLat


def model(req):
    return "unreachable"


app = Flask(__name__)
app.config["LOWLAT_MW"] = {"idle_timout": 5}
LowLat(app, model=model)
