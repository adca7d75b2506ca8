"""The Django example's settings with a misspelt lowlat-mw setting, or the mistakes in $BAD_SETTINGS (a JSON object):
startup must fail naming each."""

import json
import os

from examples.django_project.settings import *  # noqa: F403

LOWLAT_MW = json.loads(os.environ.get("BAD_SETTINGS", '{"idle_timout": 5}'))
