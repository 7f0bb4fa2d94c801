"""Web apps set up the way forking servers trip over: the Queue is created,
and its shared event reader started, at import time, so that
``gunicorn --preload`` builds them in the master process before it forks
its workers. Used by tests/test_forking_servers.py."""
