"""The dashboard at the WSGI level (werkzeug's test client, no HTTP server):
every page, every action and its effect in Redis, CSRF, read-only mode, the
auth hook, escaping, 404s, paging, the shared cache; the ``jobq dashboard``
command; a Flask mount. Real server; bounded waits."""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import werkzeug.test as werkzeug_test

from jobq import FlowProducer, Job, Queue, Worker
from jobq.dashboard import create_app
from jobq.dashboard._app import Dashboard, _redirect
from jobq.dashboard._data import PAGE_SIZE
from tests.polling import until

WAIT = 20.0
XSS = "<script>alert(1)</script>"


def processor(job: Any) -> Any:
    """Succeeds, or fails when the job's name says so; logs and reports progress."""
    job.log(f"log line of {job.name}")
    job.update_progress({"step": XSS})
    if job.name.startswith("fail"):
        raise RuntimeError(f"failed: {XSS}")
    return {"echo": job.data}


def run_until_finished(queue: Queue, redis_url: str, expected: int) -> None:
    """Run a worker until ``expected`` jobs are completed or failed."""
    worker = Worker(queue.name, processor, connection=redis_url).start()
    try:
        until(lambda: sum(queue.get_job_counts("completed", "failed").values()) >= expected,
              WAIT)
    finally:
        worker.close(timeout=WAIT)


@pytest.fixture
def app(queue: Queue, redis_url: str) -> Iterator[Dashboard]:
    """A dashboard without caching (each request reads Redis)."""
    with create_app(redis_url, cache_ttl=0) as dashboard:
        yield dashboard


@pytest.fixture
def client(app: Dashboard) -> Any:
    return werkzeug_test.Client(app)


def text(response: Any) -> str:
    return str(response.get_data(as_text=True))


def csrf(client: Any, queue: Queue) -> str:
    """The CSRF token of the client's forms (its cookie set by a GET)."""
    page = text(client.get(f"/queue?q={queue.name}"))
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def act(client: Any, queue: Queue, action: str, **fields: Any) -> Any:
    return client.post("/action", data={"csrf": csrf(client, queue), "action": action,
                                        "q": queue.name, **fields})


# -- pages -----------------------------------------------------------------------


def test_overview_lists_the_queues_with_counts_and_security_headers(
    client: Any, queue: Queue
) -> None:
    queue.add("a")
    queue.add("b", delay=60)
    response = client.get("/")
    assert response.status_code == 200
    body = text(response)
    assert f'href="/queue?q={queue.name}"' in body
    assert f'href="/jobs?q={queue.name}&amp;state=waiting" data-count="waiting">1</a>' in body
    assert 'data-count="delayed">1</a>' in body
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cache-Control"] == "no-store"
    assert "<script>" not in body.replace('<script src="/static/dashboard.js" defer></script>',
                                          "")


def test_queue_page_shows_counts_workers_chart_and_pause_state(
    client: Any, queue: Queue, redis_url: str
) -> None:
    queue.add("ok", 1)
    queue.add("fail", 2)
    run_until_finished(queue, redis_url, 2)
    queue.add("waits")
    body = text(client.get(f"/queue?q={queue.name}"))
    assert 'data-count="completed">1</span>' in body
    assert 'data-count="failed">1</span>' in body
    assert 'data-count="waiting">1</span>' in body
    assert '<svg class="chart"' in body and 'class="series completed"' in body
    assert "0 live worker(s)" in body
    assert 'data-action="pause"' in body and "running" in body
    queue.pause()
    body = text(client.get(f"/queue?q={queue.name}"))
    assert 'class="badge paused"' in body and 'data-action="resume"' in body


def test_workers_page_lists_live_workers(client: Any, queue: Queue, redis_url: str) -> None:
    with Worker(queue.name, processor, connection=redis_url, name=f"w-{XSS}") as worker:
        worker.start()
        until(lambda: queue.get_workers(), WAIT)
        body = text(client.get(f"/workers?q={queue.name}"))
        assert "w-&lt;script&gt;" in body and XSS not in body
        assert "1 live worker(s)" in text(client.get(f"/queue?q={queue.name}"))
    assert "No live worker." in text(client.get(f"/workers?q={queue.name}"))


def test_schedulers_page_and_a_tick_job_names_its_scheduler(client: Any, queue: Queue) -> None:
    queue.upsert_scheduler("nightly", cron="0 3 * * *", tz="Europe/Paris", data={"x": XSS})
    body = text(client.get(f"/schedulers?q={queue.name}"))
    assert "nightly" in body and "cron 0 3 * * * (Europe/Paris)" in body
    assert XSS not in body
    tick = queue.get_jobs("delayed")[0]
    body = text(client.get(f"/job?q={queue.name}&id={tick.id}"))
    assert "<h3>Scheduler</h3>" in body and "nightly" in body


def test_jobs_of_a_state_are_paged_in_run_order(client: Any, queue: Queue) -> None:
    ids = [queue.add("j", i).id for i in range(PAGE_SIZE + 5)]
    urgent = queue.add("urgent", priority=1).id
    first = text(client.get(f"/jobs?q={queue.name}&state=waiting"))
    shown = re.findall(r'class="job" href="[^"]*">([^<]+)</a>', first)
    assert shown == ids[:PAGE_SIZE]
    assert "page 1 of 2" in first and 'rel="next"' in first and 'rel="prev"' not in first
    second = text(client.get(f"/jobs?q={queue.name}&state=waiting&page=2"))
    shown = re.findall(r'class="job" href="[^"]*">([^<]+)</a>', second)
    assert shown == [*ids[PAGE_SIZE:], urgent]
    assert "page 2 of 2" in second and 'rel="prev"' in second
    empty = text(client.get(f"/jobs?q={queue.name}&state=failed"))
    assert "No failed job." in empty and "page 1 of 1" in empty
    assert client.get(f"/jobs?q={queue.name}&state=waiting&page=x").status_code == 400
    assert client.get(f"/jobs?q={queue.name}&state=nope").status_code == 404


def test_finished_jobs_list_newest_first_with_reasons(
    client: Any, queue: Queue, redis_url: str
) -> None:
    queue.add("fail-a")
    queue.add("ok")
    run_until_finished(queue, redis_url, 2)
    body = text(client.get(f"/jobs?q={queue.name}&state=failed"))
    assert "failed: &lt;script&gt;" in body and XSS not in body
    assert 'data-action="retry"' in body and 'data-action="remove"' in body


def test_job_page_shows_everything_escaped(client: Any, queue: Queue, redis_url: str) -> None:
    failing = queue.add(XSS + "fail", {"html": XSS}, job_id="fail-x")  # not "fail..."
    ok = queue.add("ok", {"html": XSS})
    queue.add("fail-b", {"html": XSS}, job_id="fail-b")
    run_until_finished(queue, redis_url, 3)
    body = text(client.get(f"/job?q={queue.name}&id={ok.id}"))
    assert XSS not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    for section in ("Progress", "Data", "Result", "Options", "Logs", "Timeline"):
        assert f"<h3>{section}" in body
    assert "log line of ok" in body
    assert '<span class="ev">added</span>' in body and '<span class="ev">completed</span>' in body
    assert 'data-action="retry"' in body
    body = text(client.get(f"/job?q={queue.name}&id=fail-b"))
    assert "Stack traces" in body and "RuntimeError" in body and XSS not in body
    assert '<span class="ev">failed</span>' in body
    body = text(client.get(f"/job?q={queue.name}&id={failing.id}"))
    assert XSS not in body and "&lt;script&gt;alert(1)&lt;/script&gt;fail" in body


def test_a_job_page_reads_and_shows_its_log_within_a_budget(
    client: Any, queue: Queue, redis_client: redis.Redis
) -> None:
    """Only the number of log lines was bounded: 200 lines of a MiB each
    made a 200 MB page, read whole from Redis and sent again by every
    live update."""
    job = queue.add("chatty")
    for n in range(40):
        job.log(f"L{n:03d}:" + "é" * 99_998)  # 200,001 bytes a line (a cut splits an é)
    job.log("the last line")
    response = client.get(f"/job?q={queue.name}&id={job.id}")
    assert response.status_code == 200
    body = text(response)
    assert len(body) < 200_000
    assert "the last line" in body and "Logs (newest 11 of 41)" in body
    assert "cut: 10,000 of 200,001 bytes" in body  # its split last character left out
    assert "\ufffd" not in body
    # the newest lines, in order (marked apart from any hex of the page: a
    # CSRF token held "029" now and then)
    assert "L039:é" in body and "L029:é" not in body
    assert body.index("L030:é") < body.index("L039:é") < body.index("the last line")
    assert redis_client.llen(queue._context.keys.logs(job.id)) == 41  # nothing written


def test_stale_cache_entries_are_let_go() -> None:
    """Expired entries were dropped only once 256 were kept: every job page
    viewed stayed in memory."""
    from jobq.dashboard._data import SharedCache

    cache = SharedCache(0.0)  # each entry stale at once
    for key in range(5):
        assert cache.get(key, lambda key=key: key * 2) == key * 2  # type: ignore[misc]
    assert len(cache._entries) <= 1


def test_a_slow_read_holds_up_only_the_requests_for_its_key() -> None:
    """One read lock served every key: a page slow to read (of a cluster's
    node that does not answer, a deep page of a sharded queue) held up
    every other page of the app. Requests for the same key still wait for
    its one read, and take its result."""
    from jobq.dashboard._data import SharedCache

    cache = SharedCache(60.0)
    reading, release = threading.Event(), threading.Event()
    got: list[Any] = []

    def slow() -> str:
        reading.set()
        assert release.wait(WAIT)
        return "slow"

    threads = [threading.Thread(target=lambda: got.append(cache.get("slow", slow)),
                                name=f"test-cache-{n}") for n in range(2)]
    threads[0].start()
    assert reading.wait(WAIT)
    threads[1].start()  # waits for the first one's read
    try:
        assert cache.get("other", lambda: "other") == "other"  # not held up
    finally:
        release.set()
        for thread in threads:
            thread.join(WAIT)
    assert got == ["slow", "slow"] and cache.reads == 2  # "slow" read once
    assert not cache._reading


def test_requests_for_unknown_queues_read_the_names_once_a_ttl(
    queue: Queue, redis_url: str
) -> None:
    """Each request naming an unknown queue read the names (SMEMBERS)."""
    queue.add("x")  # the queue is known
    with create_app(redis_url, cache_ttl=3600) as dashboard:
        reads: list[int] = []
        read_names = dashboard.queue_names

        def counted() -> list[str]:  # the app's own read of the names, counted
            reads.append(1)
            return read_names()

        dashboard.queue_names = counted  # type: ignore[method-assign]
        browser = werkzeug_test.Client(dashboard)
        for n in range(50):
            assert browser.get(f"/queue?q=nope{n}").status_code == 404
        assert browser.get(f"/queue?q={queue.name}").status_code == 200
        assert len(reads) <= 2


def test_job_page_shows_its_flow(client: Any, queue: Queue, redis_url: str) -> None:
    with FlowProducer(connection=redis_url) as flow:
        node = flow.add({"name": "report", "queue": queue.name, "children": [
            {"name": "page", "queue": queue.name, "data": {"html": XSS}, "job_id": "pg:1"},
            {"name": "fail-page", "queue": queue.name, "ignore_dependency_on_failure": True},
        ]})
    body = text(client.get(f"/job?q={queue.name}&id={node.job.id}"))
    assert "<h3>Flow" in body and body.count(">pending<") == 2
    run_until_finished(queue, redis_url, 3)
    body = text(client.get(f"/job?q={queue.name}&id={node.job.id}"))
    assert XSS not in body
    child = node.children[1].job.id
    assert f'href="/job?q={queue.name}&amp;id=pg%3A1">{queue.name}:pg:1</a>' in body
    assert f">{queue.name}:{child}</a></td><td>failed (ignored)" in body
    assert "&quot;html&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;" in body
    body = text(client.get(f"/job?q={queue.name}&id=pg:1"))
    assert f'parent: <a href="/job?q={queue.name}&amp;id={node.job.id}">' in body


def test_a_child_in_a_queue_whose_name_holds_another_queues_is_linked_to_its_own(
    queue_name: str, redis_url: str
) -> None:
    """A child named "<queue>:<id>" of queue `q:b` was linked to job `b:kid`
    of queue `q` (the first split naming a known queue): its buttons acted
    on that other job."""
    prefix = "{dashflow}"  # one cluster slot for the flow's queues
    inner = f"{queue_name}:b"
    with Queue(queue_name, connection=redis_url, prefix=prefix) as queue, \
            Queue(inner, connection=redis_url, prefix=prefix) as q, \
            FlowProducer(connection=redis_url, prefix=prefix) as flow, \
            create_app(redis_url, prefix=prefix) as dashboard:
        decoy = queue.add("decoy", job_id="b:kid")  # the job the wrong split names
        node = flow.add({"name": "parent", "queue": queue_name, "children": [
            {"name": "child", "queue": inner, "job_id": "kid"}]})
        body = text(werkzeug_test.Client(dashboard).get(f"/job?q={queue_name}&id={node.job.id}"))
        assert f'href="/job?q={queue_name}%3Ab&amp;id=kid">{inner}:kid</a>' in body
        assert decoy.id == "b:kid" and q.get_job("kid") is not None
        q.obliterate(force=True)
        queue.obliterate(force=True)


def test_a_prefix_with_a_hash_tag_is_served(redis_url: str, queue_name: str) -> None:
    """The flows guide's prefix ("{flows}", every queue of it in one cluster
    slot) was refused: the dashboard checked it as a queue name."""
    with Queue(queue_name, connection=redis_url, prefix="app:{flows}") as queue, \
            create_app(redis_url, prefix="app:{flows}") as dashboard:
        job = queue.add("x", job_id="tagged-1")
        browser = werkzeug_test.Client(dashboard)
        assert browser.get(f"/queue?q={queue_name}").status_code == 200
        body = text(browser.get(f"/jobs?q={queue_name}&state=waiting"))
        assert f"id={job.id}" in body
        queue.obliterate(force=True)


def test_waiting_children_jobs_are_listed_and_cleanable(
    client: Any, queue: Queue, redis_url: str
) -> None:
    """The state's key was looked up as an attribute named after the state
    (``waiting-children`` names none): every such list answered 500."""
    with FlowProducer(connection=redis_url) as flow:
        node = flow.add({"name": "report", "queue": queue.name, "children": [
            {"name": "page", "queue": queue.name}]})
    response = client.get(f"/jobs?q={queue.name}&state=waiting-children")
    assert response.status_code == 200
    shown = re.findall(r'class="job" href="[^"]*">([^<]+)</a>', text(response))
    assert shown == [node.job.id]
    assert 'data-action="remove"' in text(response)
    assert '<option value="waiting-children">' in text(client.get(f"/queue?q={queue.name}"))
    act(client, queue, "clean", state="waiting-children", grace="0")
    assert queue.get_job_counts("waiting-children") == {"waiting-children": 0}


def test_a_job_whose_record_cannot_be_read_shows_as_such_and_can_be_removed(
    client: Any, queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """One corrupt record (undecodable data, a field that is not a number,
    a time no date holds) made its state's whole list and its own page a
    500: the other jobs hidden, and the bad one impossible to remove. A
    field that is not a number reads as the scripts read it (absent)."""
    key = queue._context.keys.job
    failed = queue.add("x", 1, job_id="bad-failed")
    redis_client.hset(key(failed.id), "data", b"\xc1")  # the worker fails it
    run_until_finished(queue, redis_url, 1)
    body = text(client.get(f"/jobs?q={queue.name}&state=failed"))
    assert "id=bad-failed" in body and "record cannot be read" in body
    assert 'data-action="remove"' in body and 'data-action="retry"' not in body

    queue.add("ok", 1, job_id="good")
    queue.add(XSS, 1, job_id="bad-data")
    queue.add("n", 1, job_id="bad-priority")
    queue.add("t", 1, job_id="bad-time")
    redis_client.hset(key("bad-data"), "data", b"\xc1" + XSS.encode())
    redis_client.hset(key("bad-priority"), "priority", "abc")
    redis_client.hset(key("bad-time"), "ts", "1e300")
    response = client.get(f"/jobs?q={queue.name}&state=waiting")
    body = text(response)
    assert response.status_code == 200
    shown = re.findall(r'class="job" href="[^"]*">([^<]+)</a>', body)
    assert shown == ["good", "bad-data", "bad-priority", "bad-time"]
    assert body.count("record cannot be read") == 1 and "invalid time" in body
    response = client.get(f"/job?q={queue.name}&id=bad-priority")
    assert response.status_code == 200 and "record cannot be read" not in text(response)
    assert XSS not in body and "&lt;script&gt;" in body

    response = client.get(f"/job?q={queue.name}&id=bad-data")
    body = text(response)
    assert response.status_code == 200
    assert "record cannot be read: SerializationError" in body
    assert "\\xc1&lt;script&gt;alert(1)&lt;/script&gt;" in body and XSS not in body
    assert 'data-action="remove"' in body and "<h3>Timeline" in body
    assert client.get(f"/raw?q={queue.name}&id=bad-data").status_code == 409
    body = text(client.get(f"/job?q={queue.name}&id=bad-time"))
    assert "invalid time" in body and "record cannot be read" not in body
    assert act(client, queue, "remove", id="bad-data").status_code == 303
    assert queue.get_job_state("bad-data") == "unknown"


def test_a_large_value_is_cut_with_a_link_to_all_of_it(client: Any, queue: Queue) -> None:
    job = queue.add("big", {"blob": "<i>" + "x" * 50_000})
    body = text(client.get(f"/job?q={queue.name}&id={job.id}"))
    assert "Showing 10,000 of" in body
    raw = client.get(f"/raw?q={queue.name}&id={job.id}&part=data")
    assert raw.status_code == 200 and raw.headers["Content-Type"].startswith("application/json")
    assert raw.headers["X-Content-Type-Options"] == "nosniff"
    assert "x" * 50_000 in text(raw)
    assert client.get(f"/raw?q={queue.name}&id={job.id}&part=nope").status_code == 404


def test_a_download_is_strict_json_whatever_the_job_holds(client: Any, queue: Queue) -> None:
    """NaN and infinities were written as NaN / Infinity, which strict
    parsers refuse; bytes and str keys together made the download a
    Python repr."""
    job = queue.add("odd", {"nan": float("nan"), "inf": float("inf"), b"raw": b"\xff"})

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    raw = client.get(f"/raw?q={queue.name}&id={job.id}&part=data")
    assert json.loads(text(raw), parse_constant=refuse) == {
        "nan": "NaN", "inf": "Infinity", "raw": "\ufffd"}


def test_unknown_things_are_404(client: Any, queue: Queue) -> None:
    queue.add("a")
    assert client.get("/nope").status_code == 404
    assert client.get("/queue?q=no-such-queue").status_code == 404
    assert client.get("/queue").status_code == 400
    assert client.get(f"/job?q={queue.name}&id=missing").status_code == 404
    assert client.get(f"/job?q={queue.name}").status_code == 404
    assert client.get("/static/nope.js").status_code == 404
    response = client.get(f"/job?q={queue.name}&id={XSS}")
    assert response.status_code == 404 and XSS not in text(response)


def test_static_files_are_served_from_the_package(client: Any) -> None:
    js = client.get("/static/dashboard.js")
    assert js.status_code == 200 and js.headers["Content-Type"].startswith("text/javascript")
    assert "X-Jobq-Partial" in text(js)
    css = client.get("/static/dashboard.css")
    assert css.status_code == 200 and css.headers["Content-Type"].startswith("text/css")


def test_partial_answers_only_the_live_part(client: Any, queue: Queue) -> None:
    queue.add("a")
    response = client.get(f"/queue?q={queue.name}", headers={"X-Jobq-Partial": "1"})
    body = text(response)
    assert response.status_code == 200
    assert "<html" not in body and 'data-count="waiting">1</span>' in body


def test_an_open_job_page_whose_job_went_says_so_instead_of_failing(
    client: Any, queue: Queue,
) -> None:
    job = queue.add("a")
    live = {"X-Jobq-Partial": "1"}
    assert job.id in text(client.get(f"/job?q={queue.name}&id={job.id}", headers=live))
    assert queue.remove(job.id)
    # the page's poll: its live part now tells, with a link to the queue
    response = client.get(f"/job?q={queue.name}&id={job.id}", headers=live)
    body = text(response)
    assert response.status_code == 200 and "<html" not in body
    assert f"Job {job.id} is no longer in queue" in body
    assert f'href="/queue?q={queue.name}"' in body
    # a page opened afresh is still a 404
    assert client.get(f"/job?q={queue.name}&id={job.id}").status_code == 404
    missing = client.get(f"/job?q={queue.name}&id={XSS}", headers=live)
    assert missing.status_code == 200 and XSS not in text(missing)


def test_messages_in_the_query_are_shown_as_text(client: Any, queue: Queue) -> None:
    queue.add("a")
    body = text(client.get(f"/queue?q={queue.name}&msg={XSS}"))
    assert XSS not in body and 'class="flash"' in body


def test_mounted_under_a_path_links_stay_under_it(app: Dashboard, queue: Queue) -> None:
    queue.add("a")
    environ: dict[str, Any] = {}
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen.append(status)

    from wsgiref.util import setup_testing_defaults

    setup_testing_defaults(environ)
    environ.update(SCRIPT_NAME="/ops/jobq", PATH_INFO="/")
    body = b"".join(app(environ, start_response)).decode()
    assert seen == ["200 OK"]
    assert f'href="/ops/jobq/queue?q={queue.name}"' in body
    assert 'src="/ops/jobq/static/dashboard.js"' in body
    environ.update(PATH_INFO="")
    app(environ, start_response)
    assert seen[-1].startswith("303")


# -- actions ---------------------------------------------------------------------


def test_retry_moves_a_failed_job_back_to_waiting(
    client: Any, queue: Queue, redis_url: str
) -> None:
    job = queue.add("fail-once")
    run_until_finished(queue, redis_url, 1)
    response = act(client, queue, "retry", id=job.id)
    assert response.status_code == 303
    assert response.headers["Location"].startswith(f"/job?q={queue.name}&id={job.id}&msg=")
    assert queue.get_job_state(job.id) == "waiting"


def test_remove_promote_cancel(client: Any, queue: Queue) -> None:
    removed = queue.add("r")
    delayed = queue.add("d", delay=600)
    cancelled = queue.add("c")
    back = f"/jobs?q={queue.name}&state=waiting"
    response = act(client, queue, "remove", id=removed.id, back=back)
    assert response.headers["Location"].startswith(back + "&msg=")
    assert queue.get_job(removed.id) is None
    act(client, queue, "promote", id=delayed.id)
    assert queue.get_job_state(delayed.id) == "waiting"
    act(client, queue, "cancel", id=cancelled.id)
    assert queue.get_job_state(cancelled.id) == "failed"
    assert queue.get_job(cancelled.id).failed_reason == "cancelled from the dashboard"
    # a job gone meanwhile: a message, no error
    response = act(client, queue, "remove", id=removed.id)
    assert response.status_code == 303 and "no+job" in response.headers["Location"]
    # a refused action (promote a job that is not delayed) says why
    response = act(client, queue, "promote", id=delayed.id)
    assert response.status_code == 303 and "promote+refused" in response.headers["Location"]


def test_pause_resume_clean_and_retry_all(client: Any, queue: Queue, redis_url: str) -> None:
    queue.add("fail-1")
    act(client, queue, "pause")
    assert queue.is_paused()
    act(client, queue, "resume")
    assert not queue.is_paused()
    queue.add("fail-2")
    queue.add("ok")
    run_until_finished(queue, redis_url, 3)
    response = act(client, queue, "retry_all")
    assert "2+failed+job" in response.headers["Location"]
    assert queue.get_job_counts("waiting", "failed") == {"waiting": 2, "failed": 0}
    act(client, queue, "clean", state="completed", grace="0")
    assert queue.get_job_counts("completed") == {"completed": 0}
    act(client, queue, "clean", state="waiting", grace="0")
    assert queue.get_job_counts("waiting") == {"waiting": 0}
    assert act(client, queue, "clean", state="waiting", grace="x").status_code == 400
    queue.add("kept")  # an empty or missing grace was read as 0: every job deleted
    assert act(client, queue, "clean", state="waiting", grace="").status_code == 400
    assert act(client, queue, "clean", state="waiting").status_code == 400
    assert act(client, queue, "clean", state="waiting", grace="\u0660").status_code == 400
    assert queue.get_job_counts("waiting") == {"waiting": 1}
    assert act(client, queue, "explode").status_code == 400


def test_an_action_shows_at_once_despite_the_cache(queue: Queue, redis_url: str) -> None:
    with create_app(redis_url, cache_ttl=60) as cached:
        client = werkzeug_test.Client(cached)
        queue.add("a")
        assert "running" in text(client.get(f"/queue?q={queue.name}"))
        response = act(client, queue, "pause")
        assert 'class="badge paused"' in text(client.get(response.headers["Location"]))


def test_actions_need_the_csrf_token_of_the_cookie(
    client: Any, queue: Queue, app: Dashboard
) -> None:
    job = queue.add("a")
    token = csrf(client, queue)
    fields = {"action": "remove", "q": queue.name, "id": job.id}
    assert client.post("/action", data=fields).status_code == 403
    assert client.post("/action", data={**fields, "csrf": "0" * 64}).status_code == 403
    # a token of non-ASCII characters is refused too (the comparison raised: 500)
    assert client.post("/action", data={**fields, "csrf": "\u00e9" * 64}).status_code == 403
    # another browser's token (another cookie) is refused too
    other = werkzeug_test.Client(app)
    assert other.post("/action", data={**fields, "csrf": token}).status_code == 403
    # so is a cross-site form post carrying the right token
    response = client.post("/action", data={**fields, "csrf": token},
                           headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 403
    assert client.get("/action").status_code == 405
    assert queue.get_job(job.id) is not None
    assert client.post("/action", data={**fields, "csrf": token}).status_code == 303
    assert queue.get_job(job.id) is None


def test_processes_of_one_site_share_the_csrf_key(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """Each app keyed its tokens with a random key of its own: under
    gunicorn -w 4, a form served by one worker and posted to another got
    403 about half the time. The key is now stored once in Redis."""
    job = queue.add("a")
    with create_app(redis_url) as one, create_app(redis_url) as other:
        browser = werkzeug_test.Client(one)
        token = csrf(browser, queue)  # the form, served by one process
        fields = {"action": "remove", "q": queue.name, "id": job.id, "csrf": token}
        posted = werkzeug_test.Client(other)  # the same browser (its cookie), another process
        for cookie in browser._cookies.values():  # werkzeug's jar
            posted.set_cookie(cookie.key, cookie.value)
        assert posted.post("/action", data=fields).status_code == 303
        assert queue.get_job(job.id) is None
        with create_app(redis_url, read_only=True) as reader:
            stored = redis_client.get("jobq:dashboard:csrf-key")
            redis_client.delete("jobq:dashboard:csrf-key")
            assert werkzeug_test.Client(reader).get("/").status_code == 200
            assert redis_client.get("jobq:dashboard:csrf-key") is None  # it needs none
            redis_client.set("jobq:dashboard:csrf-key", stored)


def test_processes_take_the_csrf_key_stored_again_after_a_restart(
    queue: Queue, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process read the stored key once: after a restart without
    persistence, a process started since stored a key of its own, and the
    old processes kept theirs, so forms posted across them got 403 until
    every process was restarted."""
    from jobq.dashboard import _csrf

    monkeypatch.setattr(_csrf, "KEY_RECHECK", 0.0)  # read again at each use
    jobs = [queue.add("a") for _ in range(3)]
    with create_app(redis_url) as old:
        browser = werkzeug_test.Client(old)
        served_before = csrf(browser, queue)
        redis_client.delete("jobq:dashboard:csrf-key")  # the restart
        with create_app(redis_url) as new:  # a worker started since
            posted = werkzeug_test.Client(new)
            for cookie in browser._cookies.values():  # the same browser
                posted.set_cookie(cookie.key, cookie.value)
            token = csrf(posted, queue)
            assert csrf(browser, queue) == token  # the old process took the stored key
            fields = {"action": "remove", "q": queue.name}
            assert posted.post("/action", data={**fields, "id": jobs[0].id,
                                                "csrf": token}).status_code == 303
            assert browser.post("/action", data={**fields, "id": jobs[1].id,
                                                 "csrf": token}).status_code == 303
            # a form the old process served before it changed keys still posts to it
            assert browser.post("/action", data={**fields, "id": jobs[2].id,
                                                 "csrf": served_before}).status_code == 303
    assert all(queue.get_job(job.id) is None for job in jobs)


def test_a_process_refused_the_shared_csrf_key_reads_it_again_later(
    queue: Queue, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read of the shared key that failed with anything but a lost
    connection (an ACL, a cluster down or a server out of memory for a
    moment, here a key of another type) made the process key its forms
    with a key of its own for good: forms posted to other processes of the
    site got 403 until it restarted."""
    from jobq.dashboard import _csrf

    monkeypatch.setattr(_csrf, "KEY_RECHECK", 0.0)  # read again at each use
    name = "jobq:dashboard:csrf-key"
    kept = redis_client.get(name)
    redis_client.delete(name)
    redis_client.hset(name, "not", "a string")  # GET refused: WRONGTYPE
    job = queue.add("a")
    try:
        with caplog.at_level(logging.WARNING, logger="jobq"), create_app(redis_url) as one:
            browser = werkzeug_test.Client(one)
            assert csrf(browser, queue) == csrf(browser, queue)  # a key of its own, kept
            said = [r for r in caplog.records if "cannot share its CSRF key" in r.getMessage()]
            assert len(said) == 1  # said once
            redis_client.delete(name)  # the key can be shared now
            with create_app(redis_url) as other:
                posted = werkzeug_test.Client(other)
                for cookie in browser._cookies.values():  # the same browser
                    posted.set_cookie(cookie.key, cookie.value)
                token = csrf(posted, queue)
                assert csrf(browser, queue) == token  # the first process shares it now
                fields = {"action": "remove", "q": queue.name, "id": job.id, "csrf": token}
                assert browser.post("/action", data=fields).status_code == 303
    finally:
        redis_client.delete(name)
        if kept is not None:
            redis_client.set(name, kept)
    assert queue.get_job(job.id) is None


@pytest.mark.parametrize(("allowed", "auth", "answered"), [
    # loopback alone (DNS rebinding), "localhost." (a trailing dot) too
    (None, None, {"localhost", "localhost.", "LocalHost", "127.0.0.1", "[::1]"}),
    (None, lambda environ: True, None),  # any: auth answers
    (["jobs.example.com"], None, {"jobs.example.com", "JOBS.example.com", "jobs.example.com."}),
    # as Django's ALLOWED_HOSTS: a leading dot, the domain and its subdomains
    # (it matched nothing, silently); a trailing dot ignored; addresses
    ([".example.com", "127.0.0.1", "[::1]"], None,
     {"jobs.example.com", "JOBS.example.com", "jobs.example.com.", "example.com", "127.0.0.1",
      "[::1]"}),
    ("*", None, None),
])
def test_requests_are_answered_for_the_allowed_host_names(
    queue: Queue, redis_url: str, allowed: Any, auth: Any, answered: set[str] | None
) -> None:
    """Under gunicorn, create_app() answered any Host: a page of another
    site whose name was pointed at 127.0.0.1 could read it and act."""
    with create_app(redis_url, auth=auth, allowed_hosts=allowed) as app:
        client = werkzeug_test.Client(app)
        names = {"localhost", "localhost.", "LocalHost", "127.0.0.1", "[::1]", "evil.example",
                 "jobs.example.com",
                 "JOBS.example.com", "jobs.example.com.", "example.com", "localhost.evil.example",
                 "badexample.com"}
        answered = names if answered is None else answered
        for name in names:
            response = client.get("/", headers={"Host": f"{name}:8000"})
            assert response.status_code == (200 if name in answered else 421), name
            response = client.post("/action", headers={"Host": name},
                                   data={"action": "pause", "q": queue.name})
            assert response.status_code == (403 if name in answered else 421), name
    assert not queue.is_paused()
    for bad in ([], [""], ["*", "a"], [5], ["."], ["*.example.com"], [" example.com"]):
        with pytest.raises(ValueError, match="allowed_hosts"):
            create_app(redis_url, allowed_hosts=bad)
    # a port is never matched: such a name answered nothing, and said nothing
    with pytest.raises(ValueError, match="without a port: 'jobs.example.com:8000'"):
        create_app(redis_url, allowed_hosts=["jobs.example.com:8000"])
    with pytest.raises(ValueError, match=r"without a port: '\[::1\]:80'"):
        create_app(redis_url, allowed_hosts=["[::1]:80"])


def test_back_cannot_add_a_header_to_the_redirect(client: Any, queue: Queue) -> None:
    """Only the path of ``back`` was checked: CR LF in its query went raw
    into the Location header, adding headers of the sender's choice."""
    queue.add("a")
    for back in ("/?a\r\nX-Injected: 1", f"/job?q={queue.name}&id=x\nX-Injected: 2",
                 "/?\r\n\r\n<script>x</script>", "/jobs?q=a b"):
        response = act(client, queue, "pause", back=back)
        assert response.status_code == 303
        assert "X-Injected" not in response.headers
        location = response.headers["Location"]
        assert location.startswith(f"/queue?q={queue.name}&msg="), location
    # a back of printable URL characters is kept
    back = f"/jobs?q={queue.name}&state=failed&page=2"
    assert act(client, queue, "resume", back=back).headers["Location"].startswith(back + "&")
    # and a redirect never writes a control character, whoever builds it
    assert _redirect("/x?a\r\nb: 1").headers[-1] == ("Location", "/x?a%0D%0Ab:%201")


def test_read_only_refuses_actions_and_shows_no_forms(queue: Queue, redis_url: str) -> None:
    job = queue.add("a", delay=60)
    with create_app(redis_url, read_only=True, cache_ttl=0) as read_only:
        client = werkzeug_test.Client(read_only)
        for url in ("/", f"/queue?q={queue.name}", f"/jobs?q={queue.name}&state=delayed",
                    f"/job?q={queue.name}&id={job.id}"):
            body = text(client.get(url))
            assert "<form" not in body.replace('<form class="search"', "")
            assert "read-only" in body
        # even a well-formed, signed request is refused
        cookie_client = werkzeug_test.Client(read_only)
        cookie_client.get("/")
        cookie = cookie_client.get_cookie("jobq_csrf").value
        token = read_only._csrf.sign(cookie)
        response = cookie_client.post("/action", data={"csrf": token, "action": "promote",
                                                       "q": queue.name, "id": job.id})
        assert response.status_code == 403
    assert queue.get_job_state(job.id) == "delayed"


def test_the_auth_hook_guards_every_request(queue: Queue, redis_url: str) -> None:
    queue.add("a")
    seen: list[str] = []

    def auth(environ: dict[str, Any]) -> bool:
        seen.append(environ["PATH_INFO"])
        return bool(environ.get("HTTP_X_USER") == "ops")

    with create_app(redis_url, auth=auth, cache_ttl=0) as guarded:
        client = werkzeug_test.Client(guarded)
        for url in ("/", f"/queue?q={queue.name}", "/static/dashboard.js", "/nope"):
            response = client.get(url)
            assert response.status_code == 403 and "jobq" in text(response)
            assert queue.name not in text(response)
        assert client.post("/action", data={"action": "pause", "q": queue.name}
                           ).status_code == 403
        assert client.get("/", headers={"X-User": "ops"}).status_code == 200
    assert seen[:3] == ["/", "/queue", "/static/dashboard.js"]
    assert not queue.is_paused()


# -- load, lifecycle ---------------------------------------------------------------


def test_many_pollers_share_one_read_per_interval(queue: Queue, redis_url: str) -> None:
    queue.add("a")
    with create_app(redis_url, cache_ttl=60) as cached:
        results: list[int] = []

        def poll() -> None:
            client = werkzeug_test.Client(cached)
            for _ in range(10):
                results.append(client.get(f"/queue?q={queue.name}",
                                          headers={"X-Jobq-Partial": "1"}).status_code)

        threads = [threading.Thread(target=poll) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert results == [200] * 80
        # one read of the queue's summary, one of the known queues' names
        assert cached.cache.reads == 2


def test_close_is_idempotent_and_keeps_a_callers_client(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    app = create_app(redis_client, cache_ttl=0)
    queue.add("a")
    assert werkzeug_test.Client(app).get(f"/queue?q={queue.name}").status_code == 200
    app.close()
    app.close()
    assert "closed" in repr(app)
    assert redis_client.ping()
    with pytest.raises(TypeError):
        create_app(redis_url, auth="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        create_app(redis_url, prefix="a b")


def test_redis_unreachable_is_a_503_page() -> None:
    with create_app("redis://127.0.0.1:1/0", cache_ttl=0) as app:
        response = werkzeug_test.Client(app).get("/")
        assert response.status_code == 503 and "unreachable" in text(response)


# -- mounts, command -----------------------------------------------------------------


def test_mounted_in_flask(queue: Queue, redis_url: str) -> None:
    import flask
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    site = flask.Flask(__name__)

    @site.get("/")
    def home() -> str:
        return "home"

    with create_app(redis_url, cache_ttl=0) as dashboard:
        site.wsgi_app = DispatcherMiddleware(site.wsgi_app,  # type: ignore[method-assign]
                                             {"/admin/jobq": dashboard})
        queue.add("a", delay=60)
        client = site.test_client()
        assert text(client.get("/")) == "home"
        body = text(client.get("/admin/jobq/"))
        assert f'href="/admin/jobq/queue?q={queue.name}"' in body
        page = text(client.get(f"/admin/jobq/jobs?q={queue.name}&state=delayed"))
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert token
        job_id = queue.get_jobs("delayed")[0].id
        response = client.post("/admin/jobq/action", data={
            "csrf": token.group(1), "action": "promote", "q": queue.name, "id": job_id})
        assert response.status_code == 303
        assert response.headers["Location"].startswith("/admin/jobq/job?")
        assert queue.get_job_state(job_id) == "waiting"


def test_command_refuses_a_public_bind_without_auth(redis_url: str) -> None:
    from jobq.cli import main

    assert main(["--url", redis_url, "dashboard", "--host", "0.0.0.0"]) == 2
    from jobq.dashboard._app import is_loopback  # what --host is checked with

    assert is_loopback("LOCALHOST.") and is_loopback("127.0.0.2") and is_loopback("::1")
    assert not is_loopback("localhost.evil.example") and not is_loopback(".")


def test_command_refuses_an_auth_it_cannot_load_or_call(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobq.cli import main

    assert main(["--url", redis_url, "dashboard", "--auth", "no_such_module:check"]) == 2
    assert "cannot load 'no_such_module:check'" in capsys.readouterr().err
    assert main(["--url", redis_url, "dashboard", "--auth", "os:sep"]) == 2
    assert "not a callable" in capsys.readouterr().err


def test_a_job_delayed_by_a_retry_shows_when_it_is_due(
    client: Any, queue: Queue, redis_url: str, redis_client: Any
) -> None:
    """The delayed list showed added + delay: for a job waiting out its
    retry backoff, the time it was added (its delay is the add's, 0)."""
    from jobq.dashboard._html import when

    job = queue.add("fails", attempts=2, backoff={"type": "fixed", "delay": 600})

    def fail(job: Job) -> None:
        raise RuntimeError("again later")

    with Worker(queue.name, fail, connection=redis_url):
        until(lambda: queue.get_job_state(job.id) == "delayed", WAIT)
    ready = float(redis_client.hget(f"jobq:{{{queue.name}}}:job:{job.id}", "rdy")) / 1000
    page = text(client.get(f"/jobs?q={queue.name}&state=delayed"))
    assert when(ready) in page and when(queue.get_job(job.id).timestamp) not in page  # type: ignore[union-attr]


def test_command_serves_until_interrupted(queue: Queue, redis_url: str) -> None:
    queue.add("a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobq", "--url", redis_url, "dashboard", "--port", "0",
         "--read-only"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = f"http://127.0.0.1:{match.group(1)}/queue?q={queue.name}"
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            body = response.read().decode()
            assert response.status == 200 and "read-only" in body
            assert response.headers["Content-Security-Policy"]
        # served on loopback without auth: only requests to a loopback name
        # (a rebound name of another site is refused, before any page)
        for host, status in (("attacker.example", 421), ("localhost", 200), ("[::1]", 200)):
            conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=WAIT)
            try:
                conn.request("GET", f"/queue?q={queue.name}",
                             headers={"Host": f"{host}:{match.group(1)}"})
                assert conn.getresponse().status == status, host
            finally:
                conn.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_a_sharded_queue_shows_as_one_queue(client: Any, queue_name: str, redis_url: str) -> None:
    from jobq import ShardedQueue

    with ShardedQueue(f"{queue_name}-s", shards=4, connection=redis_url) as sharded:
        jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(12)])
        body = text(client.get("/"))
        assert f'href="/queue?q={sharded.name}"' in body
        assert f"{sharded.name}~" not in body  # its shards are not listed
        waiting = f'href="/jobs?q={sharded.name}&amp;state=waiting" data-count="waiting">12</a>'
        assert waiting in body
        listed = text(client.get(f"/jobs?q={sharded.name}&state=waiting"))
        assert all(f"id={job.id}" in listed for job in jobs)
        page = client.get(f"/job?q={sharded.name}&id={jobs[5].id}")
        assert page.status_code == 200 and jobs[5].id in text(page)
        # one record that cannot be read hid every job of its list (500)
        shard = sharded.shard_for(jobs[3].id)._context
        shard.redis.hset(shard.keys.job(jobs[3].id), "data", b"\xc1")
        response = client.get(f"/jobs?q={sharded.name}&state=waiting")
        listed = text(response)
        assert response.status_code == 200 and all(f"id={job.id}" in listed for job in jobs)
        assert listed.count("record cannot be read") == 1
        act(client, sharded, "pause")  # type: ignore[arg-type]
        assert sharded.is_paused()
        sharded.obliterate()


def test_a_sharded_queues_pages_go_no_deeper_than_a_bound(
    client: Any, queue_name: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of a sharded queue reads every shard's jobs up to it: page
    6,000 of 150,000 jobs took 10 s (and, under the app's one read lock,
    held up every other page); any page number was read."""
    from jobq import ShardedQueue
    from jobq.dashboard import _data

    monkeypatch.setattr(_data, "SHARDED_DEPTH", 2 * PAGE_SIZE)
    with ShardedQueue(f"{queue_name}-s", shards=2, connection=redis_url) as sharded:
        sharded.add_bulk([{"name": "x", "data": i} for i in range(3 * PAGE_SIZE)])
        second = text(client.get(f"/jobs?q={sharded.name}&state=waiting&page=2"))
        assert second.count('class="job"') == PAGE_SIZE
        assert "Pages after 2 of a sharded queue are not shown" in second
        third = text(client.get(f"/jobs?q={sharded.name}&state=waiting&page=3"))
        assert 'class="job"' not in third and "Not shown." in third
        sharded.obliterate()
