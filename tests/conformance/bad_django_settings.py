"""The Django example's settings with a misspelt lowlat-mw setting (startup must fail naming it)."""

from examples.django_project.settings import *  # noqa: F403

LOWLAT_MW = {"idle_timout": 5}
