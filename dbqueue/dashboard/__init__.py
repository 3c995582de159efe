"""The web dashboard (``dbqueue dashboard``; mount ``create_app(app)`` in your own ASGI app, or
``wsgi_app(app)`` in a WSGI one). Needs the ``dashboard`` extra: Starlette, Jinja2, uvicorn."""

from __future__ import annotations

from dbqueue.dashboard.web import create_app, wsgi_app

__all__ = ["create_app", "wsgi_app"]
