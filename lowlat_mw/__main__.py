"""``python -m lowlat_mw``: the ``lowlat-mw`` command (serve, chat, bench), for when the script is not on PATH."""

from __future__ import annotations

import sys

from lowlat_mw.servers.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m lowlat_mw"))
