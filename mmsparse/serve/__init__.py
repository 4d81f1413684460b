"""`mmsparse serve`: a search page and a JSON API over an index (FastAPI + uvicorn).

create_app(index, dense_index=..., image_root=...) builds the app (models loaded once);
run_server(app, host, port) serves it. See app.py for the routes and images.py for which image
files may be sent. This package uses the library (mmsparse.api.querying) and never the command line.
"""

from __future__ import annotations


def create_app(*args, **kwargs):
    """See mmsparse.serve.app.create_app."""
    from .app import create_app as make

    return make(*args, **kwargs)


def run_server(*args, **kwargs) -> None:
    """See mmsparse.serve.app.run_server."""
    from .app import run_server as run

    run(*args, **kwargs)


__all__ = ["create_app", "run_server"]
