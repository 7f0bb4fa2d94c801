"""The jobq dashboard in a Django project, for staff only::

    urlpatterns = [
        ...
        path("jobq/", include("jobq.contrib.django.urls")),
    ]

It shows the queues under ``settings.JOBQ["PREFIX"]`` on
``settings.JOBQ["CONNECTION"]`` (see :mod:`jobq.dashboard`). A visitor who
is not logged in is sent to ``settings.LOGIN_URL``; a logged-in user who is
not active staff gets 403. Django's auth middleware must be installed.
"""

from __future__ import annotations

from django.urls import re_path

from .views import dashboard

app_name = "jobq"

urlpatterns = [
    re_path(r"^(?P<path>.*)$", dashboard, name="dashboard"),
]
