"""Running servers: the ``lowlat-mw`` command, :func:`~lowlat_mw.servers.serving.run`, and the
hardened uvicorn, daphne and gunicorn shims. The top of the house: may import every layer below it,
and the servers themselves (uvicorn, daphne, gunicorn), never a web framework.
"""
