"""The jobq web dashboard: a WSGI application on the standard library alone.

``jobq dashboard`` serves it (wsgiref, for development and operations), and
:func:`create_app` returns it to mount in Flask, Django or gunicorn::

    from jobq.dashboard import create_app

    app = create_app("redis://localhost:6379/0", read_only=False,
                     auth=lambda environ: environ.get("REMOTE_USER") == "ops")
    ...
    app.close()  # closes the queues it opened and the client it made

Pages are server-rendered HTML whose links and forms work without
JavaScript; a small script (``static/dashboard.js``) refreshes the live part
of each page by polling it. Every read from Redis goes through one cache per
app (one read at a time, each at most once per ``cache_ttl``), so the load
on Redis is bounded however many browsers are open. The app starts no
thread.
"""

from __future__ import annotations

from ._app import Dashboard, create_app

__all__ = ["Dashboard", "create_app"]
