"""The dashboard in a real browser: headless Chromium (Debian's chromium and
chromium-driver) driven by Selenium, against the dashboard served on
loopback by wsgiref and a real Redis server.

Each page loads with real jobs behind it and logs no console error; counts
and a job's state change live, without a reload; every action is taken by
clicking and its effect read in Redis; HTML in a job shows as text.

With ``JOBQ_DASHBOARD_SCREENSHOTS=DIR`` the page tests also save PNGs at
1280 px and at phone width (the README's pictures come from there).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By

from jobq import Queue, Worker
from jobq.dashboard import create_app
from jobq.dashboard._command import serve
from tests.polling import until

pytestmark = pytest.mark.browser

WAIT = 20.0
XSS = "<script>alert(1)</script>"
SHOTS = os.environ.get("JOBQ_DASHBOARD_SCREENSHOTS")


def _find(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


CHROMIUM = _find(("chromium", "chromium-browser", "google-chrome"))
CHROMEDRIVER = _find(("chromedriver",))


def processor(job: Any) -> Any:
    job.log(f"handled {job.name}")
    job.update_progress(100)
    if job.name.startswith("fail"):
        raise RuntimeError("it failed")
    return {"ok": job.data}


@pytest.fixture(scope="module")
def base_url(redis_url: str) -> Iterator[str]:
    """The dashboard on a free loopback port: reads shared for 0.1 s, the
    page's live part refreshed every 0.3 s."""
    app = create_app(redis_url, cache_ttl=0.1, poll_interval=0.3)
    server = serve(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, name="jobq-dashboard-http-test",
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(WAIT)
        server.server_close()
        app.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        missing = ("no chromium and chromedriver on PATH (apt-get install chromium "
                   "chromium-driver)")
        if os.environ.get("JOBQ_TEST_REQUIRE_BROWSER"):  # CI installs them: never skip there
            pytest.fail(missing)
        pytest.skip(missing)
    os.environ.setdefault("SE_AVOID_STATS", "true")
    profile = tempfile.mkdtemp(prefix="jobq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    try:
        driver = webdriver.Chrome(options=options, service=service)
    except WebDriverException as exc:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.fail(f"chromium did not start: {exc}")
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: Any, base_url: str) -> Iterator[Callable[[str], None]]:
    """Open a page of the dashboard; after the test, no console error may
    have been logged."""
    browser.set_window_size(1280, 900)
    browser.get_log("browser")  # forget the previous test's messages

    def open_page(path: str) -> None:
        browser.get(base_url + path)

    yield open_page
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []


def shot(browser: Any, name: str) -> None:
    """Save the page at 1280 px and at phone width when screenshots are asked for."""
    if not SHOTS:
        return
    folder = Path(SHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    for width, height, suffix in ((1280, 900, ""), (390, 844, "-phone")):
        browser.set_window_size(width, height)
        full = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(width, min(max(height, full + 120), 2400))
        browser.save_screenshot(str(folder / f"dashboard-{name}{suffix}.png"))
    browser.set_window_size(1280, 900)


def finish(queue: Queue, redis_url: str, expected: int) -> None:
    with Worker(queue.name, processor, connection=redis_url) as worker:
        worker.start()
        until(lambda: sum(queue.get_job_counts("completed", "failed").values()) >= expected,
              WAIT)


def text_of(browser: Any, css: str) -> str:
    try:
        return str(browser.find_element(By.CSS_SELECTOR, css).text)
    except StaleElementReferenceException:  # replaced by a refresh in between
        return ""


def click(browser: Any, css: str, asks: str | None = None) -> None:
    """Click the element, again if a live refresh replaced it meanwhile; with
    ``asks``, the page must ask a question containing it, which is accepted;
    then wait for the page the form leads to (a new document)."""
    browser.execute_script("window.jobqBeforeClick = true;")
    press(browser, css)
    if asks is not None:
        alert = browser.switch_to.alert
        assert asks in alert.text, alert.text
        alert.accept()
    until(lambda: browser.execute_script("return window.jobqBeforeClick !== true;")
          and "msg=" in browser.current_url, WAIT)


def press(browser: Any, css: str) -> None:
    """Click the element, again if a live refresh replaced it meanwhile."""

    def clicked() -> bool:
        try:
            browser.find_element(By.CSS_SELECTOR, css).click()
        except StaleElementReferenceException:
            return False
        return True

    until(clicked, WAIT)


def dismissed(browser: Any, css: str, asks: str) -> None:
    """Click the element, and say no to the question it asks: the form is
    not sent (the page stays, not reloaded)."""
    browser.execute_script("window.jobqBeforeClick = true;")
    press(browser, css)
    alert = browser.switch_to.alert
    assert asks in alert.text, alert.text
    alert.dismiss()
    assert browser.execute_script("return window.jobqBeforeClick === true;")


@pytest.fixture
def shown(queue: Queue, redis_url: str) -> Iterator[Queue]:
    """The test's queue; for screenshots, a queue with a plain name."""
    if not SHOTS:
        yield queue
        return
    with Queue("images", connection=redis_url) as images:
        images.obliterate(force=True)
        yield images
        images.obliterate(force=True)


def test_every_page_loads_with_real_jobs(
    browser: Any, page: Callable[[str], None], shown: Queue, redis_url: str
) -> None:
    queue = shown
    for i in range(4):
        queue.add("resize", {"image": f"photo-{i}.jpg", "width": 640})
    queue.add("fail-upload", {"image": "broken.jpg"})
    finish(queue, redis_url, 5)
    for i in range(3):
        queue.add("thumbnail", {"image": f"new-{i}.jpg"})
    queue.add("report", {"day": "monday"}, delay=3600)
    queue.upsert_scheduler("nightly-report", cron="0 3 * * *", tz="Europe/Paris",
                           name="report")
    q = queue.name
    page("/")
    assert q in browser.page_source
    shot(browser, "overview")
    page(f"/queue?q={q}")
    assert text_of(browser, '.card [data-count="completed"]') == "4"
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline")
    shot(browser, "queue")
    for state, count in (("waiting", 3), ("delayed", 2), ("completed", 4), ("failed", 1)):
        page(f"/jobs?q={q}&state={state}")
        assert len(browser.find_elements(By.CSS_SELECTOR, "a.job")) == count
        if state == "completed":
            shot(browser, "jobs")
    failed = queue.get_jobs("failed")[0]
    page(f"/job?q={q}&id={failed.id}")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "RuntimeError" in body and "handled fail-upload" in body
    shot(browser, "job")
    page(f"/workers?q={q}")
    page(f"/schedulers?q={q}")
    assert "nightly-report" in browser.page_source


def test_counts_and_job_state_change_live(
    browser: Any, page: Callable[[str], None], queue: Queue, redis_url: str
) -> None:
    first = queue.add("first")
    q = queue.name
    page(f"/queue?q={q}")
    browser.execute_script("window.jobqNotReloaded = true;")
    queue.add_bulk([{"name": "more"} for _ in range(2)])
    until(lambda: text_of(browser, '.card [data-count="waiting"]') == "3", WAIT)
    finish(queue, redis_url, 3)
    until(lambda: text_of(browser, '.card [data-count="completed"]') == "3", WAIT)
    assert text_of(browser, '.card [data-count="waiting"]') == "0"
    assert browser.execute_script("return window.jobqNotReloaded === true;")
    # a job's page follows its state
    job = queue.add("later", delay=3600)
    page(f"/job?q={q}&id={job.id}")
    browser.execute_script("window.jobqNotReloaded = true;")
    assert text_of(browser, "[data-state]") == "delayed"
    job.promote()
    until(lambda: text_of(browser, "[data-state]") == "waiting", WAIT)
    assert browser.execute_script("return window.jobqNotReloaded === true;")
    # and a list shows new jobs
    page(f"/jobs?q={q}&state=completed")
    browser.execute_script("window.jobqNotReloaded = true;")
    assert len(browser.find_elements(By.CSS_SELECTOR, "a.job")) == 3
    assert first.id in browser.page_source
    queue.add("one-more")
    finish(queue, redis_url, 5)
    until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "a.job")) == 5, WAIT)
    assert browser.execute_script("return window.jobqNotReloaded === true;")


def test_every_action_by_clicking(
    browser: Any, page: Callable[[str], None], queue: Queue, redis_url: str
) -> None:
    failed = queue.add("fail-it")
    finish(queue, redis_url, 1)
    q = queue.name
    page(f"/jobs?q={q}&state=failed")
    click(browser, 'button[data-action="retry"]')
    assert queue.get_job_state(failed.id) == "waiting"
    assert "retried" in browser.find_element(By.CSS_SELECTOR, ".flash").text

    delayed = queue.add("later", delay=3600)
    page(f"/job?q={q}&id={delayed.id}")
    click(browser, 'button[data-action="promote"]')
    assert queue.get_job_state(delayed.id) == "waiting"

    # what cannot be undone asks first; a "no" sends nothing
    page(f"/job?q={q}&id={delayed.id}")
    dismissed(browser, 'button[data-action="cancel"]', f"Cancel job {delayed.id}?")
    assert queue.get_job_state(delayed.id) == "waiting"
    click(browser, 'button[data-action="cancel"]', f"Cancel job {delayed.id}?")
    assert queue.get_job_state(delayed.id) == "failed"

    page(f"/job?q={q}&id={delayed.id}")
    dismissed(browser, 'button[data-action="remove"]', f"Remove job {delayed.id} for good?")
    assert queue.get_job_state(delayed.id) == "failed"
    click(browser, 'button[data-action="remove"]', f"Remove job {delayed.id} for good?")
    assert queue.get_job(delayed.id) is None

    page(f"/queue?q={q}")
    click(browser, 'button[data-action="pause"]')
    assert queue.is_paused()
    click(browser, 'button[data-action="resume"]')
    assert not queue.is_paused()

    assert queue.get_job_counts("waiting")["waiting"] == 1
    browser.find_element(By.CSS_SELECTOR, 'select[name="state"] option[value="waiting"]').click()
    grace = browser.find_element(By.CSS_SELECTOR, 'input[name="grace"]')
    grace.clear()
    grace.send_keys("0")
    asked = f"Delete every waiting job of queue {q} older than 0 s, for good?"
    dismissed(browser, 'button[data-action="clean"]', asked)
    assert queue.get_job_counts("waiting")["waiting"] == 1
    click(browser, 'button[data-action="clean"]', asked)
    assert queue.get_job_counts("waiting")["waiting"] == 0

    queue.add("fail-again")
    finish(queue, redis_url, 1)
    page(f"/queue?q={q}")
    asked = f"Retry every failed job of queue {q}?"
    dismissed(browser, 'button[data-action="retry_all"]', asked)
    assert queue.get_job_counts("failed")["failed"] == 1
    click(browser, 'button[data-action="retry_all"]', asked)
    assert queue.get_job_counts("failed")["failed"] == 0


def test_html_in_a_job_shows_as_text(
    browser: Any, page: Callable[[str], None], queue: Queue
) -> None:
    job = queue.add(XSS, {"comment": XSS, "img": '<img src=x onerror="alert(2)">'})
    job.log(XSS)
    page(f"/job?q={queue.name}&id={job.id}")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert XSS in body and '<img src=x onerror=' in body
    assert not browser.find_elements(By.CSS_SELECTOR, "#live img, #live script")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 (raises when there is none)
    page(f"/jobs?q={queue.name}&state=waiting")
    assert XSS in browser.find_element(By.TAG_NAME, "body").text
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
