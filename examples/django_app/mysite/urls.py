from django.urls import include, path
from shop import views

urlpatterns = [
    path("add/", views.add),
    path("signup/", views.signup),
    # the jobq dashboard, for logged-in staff (needs django.contrib.auth and
    # its middleware, which this small example leaves out)
    path("jobq/", include("jobq.contrib.django.urls")),
]
