"""HTML of the dashboard's pages: plain string templates in which every
value from Redis, the request or the caller goes through :func:`e`
(``html.escape``), so that job names, data, results and logs show as text.

Each page is a head, a live part (``<div id="live">``, which the script
replaces with a fresh copy fetched every few seconds) and a tail; forms
that take input stay out of the live part so that a refresh never eats
what is being typed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from typing import Any
from urllib.parse import urlencode

from .._json import dumps
from ..job import STATES

#: Characters of a value (data, result, progress) shown inline; the rest
#: is behind a link to the whole value.
MAX_SHOWN = 10_000
#: Characters of a failed reason shown in a list.
MAX_REASON = 120


def e(value: object) -> str:
    """The value as HTML text (quotes escaped too: safe in attributes)."""
    return escape(str(value), quote=True)


def pretty(value: Any) -> str:
    """A value as indented, strict JSON (see ``jobq._json.dumps``)."""
    return dumps(value, indent=2, sort_keys=True)


def when(seconds: float | None) -> str:
    """An epoch time as UTC text, '-' for None, 'invalid time' for one no
    date can hold (a record written by hand: ``ts 1e300``, ``nan``)."""
    if not seconds:
        return "-"
    try:
        moment = datetime.fromtimestamp(seconds, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "invalid time"
    return moment.strftime("%Y-%m-%d %H:%M:%S") + f".{int(moment.microsecond / 1000):03d}Z"


def short(text: str | None, limit: int = MAX_REASON) -> str:
    """Text cut to ``limit`` characters with an ellipsis."""
    if not text:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Ctx:
    """What every page needs from the request: where the app is mounted,
    the CSRF token for its forms, and whether actions are allowed."""

    base: str
    csrf: str
    read_only: bool
    poll_ms: int

    def url(self, path: str, **query: object) -> str:
        """An absolute path inside the app, with its query (None values left out)."""
        params = {k: str(v) for k, v in query.items() if v is not None}
        return self.base + path + ("?" + urlencode(params) if params else "")

    def static(self, name: str) -> str:
        """The URL of a file shipped in the package's static folder."""
        return f"{self.base}/static/{name}"


def layout(ctx: Ctx, title: str, crumbs: Sequence[tuple[str, str | None]], head: str,
           live: str, tail: str = "", message: str | None = None) -> str:
    """A whole page. ``crumbs`` are (text, url or None) pairs."""
    trail = " / ".join(
        f'<a href="{e(url)}">{e(text)}</a>' if url else f"<span>{e(text)}</span>"
        for text, url in crumbs
    )
    flash = f'<p class="flash" role="status">{e(message)}</p>' if message else ""
    mode = '<span class="badge">read-only</span>' if ctx.read_only else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} · jobq</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{e(ctx.static('dashboard.css'))}">
<script src="{e(ctx.static('dashboard.js'))}" defer></script>
</head>
<body data-poll-ms="{ctx.poll_ms}">
<header><a class="brand" href="{e(ctx.url('/'))}">jobq</a> <nav>{trail}</nav> {mode}
<span class="live-status" id="live-status" aria-live="polite"></span></header>
<main>
{flash}{head}
<div id="live">{live}</div>
{tail}
</main>
</body>
</html>
"""


def form(ctx: Ctx, action: str, label: str, fields: Mapping[str, object],
         css: str = "", confirm: str = "") -> str:
    """A one-button POST form for an action ('' in read-only mode); with
    ``confirm``, the script asks that question before the form is sent."""
    if ctx.read_only:
        return ""
    hidden = "".join(
        f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in fields.items()
    )
    kind = f" {css}" if css else ""
    ask = f' data-confirm="{e(confirm)}"' if confirm else ""
    return (
        f'<form class="inline" method="post" action="{e(ctx.url("/action"))}"{ask}>'
        f'<input type="hidden" name="csrf" value="{e(ctx.csrf)}">'
        f'<input type="hidden" name="action" value="{e(action)}">{hidden}'
        f'<button type="submit" class="btn{kind}" data-action="{e(action)}">{e(label)}</button>'
        "</form>"
    )


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], empty: str) -> str:
    """A table of already-escaped cells."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="empty">{e(empty)}</p>'
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>' \
           f"<tbody>{body}</tbody></table></div>"


def chart(completed: Sequence[int], failed: Sequence[int], minutes: int) -> str:
    """An inline SVG of completed and failed jobs per minute, oldest on the
    left, the minute in progress on the right."""
    width, height, pad = 600, 140, 18
    peak = max([1, *completed, *failed])

    def points(series: Sequence[int]) -> str:
        values = list(series[:minutes]) + [0] * (minutes - len(series[:minutes]))
        step = width / max(1, minutes - 1)
        return " ".join(
            f"{width - i * step:.1f},{height - pad - v / peak * (height - 2 * pad):.1f}"
            for i, v in enumerate(values)
        )

    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="completed and failed jobs per minute, last {minutes} minutes">'
        f"<title>jobs per minute, last {minutes} minutes</title>"
        f'<line class="axis" x1="0" y1="{height - pad}" x2="{width}" y2="{height - pad}"/>'
        f'<polyline class="series completed" points="{points(completed)}"/>'
        f'<polyline class="series failed" points="{points(failed)}"/>'
        f'<text x="2" y="12">{peak}/min</text>'
        f'<text x="2" y="{height - 3}">{minutes} min ago</text>'
        f'<text x="{width - 2}" y="{height - 3}" text-anchor="end">now</text>'
        "</svg>"
        '<p class="legend"><span class="key completed"></span> completed '
        '<span class="key failed"></span> failed</p>'
    )


def state_links(ctx: Ctx, queue: str, counts: Mapping[str, int]) -> str:
    """Cards of a queue's counts by state, each a link to its jobs."""
    cards = "".join(
        f'<a class="card state-{e(s)}" href="{e(ctx.url("/jobs", q=queue, state=s))}">'
        f'<span class="n" data-count="{e(s)}">{counts.get(s, 0)}</span>'
        f'<span class="label">{e(s)}</span></a>'
        for s in STATES
    )
    return f'<div class="cards">{cards}</div>'


def value_block(ctx: Ctx, title: str, value: Any, queue: str, job_id: str, part: str) -> str:
    """A value as JSON in a <pre>, cut at MAX_SHOWN characters with a link to all of it."""
    text = pretty(value)
    more = ""
    if len(text) > MAX_SHOWN:
        more = (
            f'<p class="note">Showing {MAX_SHOWN:,} of {len(text):,} characters: '
            f'<a href="{e(ctx.url("/raw", q=queue, id=job_id, part=part))}">the whole value</a>'
            "</p>"
        )
        text = text[:MAX_SHOWN] + "…"
    return f'<section><h3>{e(title)}</h3><pre class="value">{e(text)}</pre>{more}</section>'


def pager(ctx: Ctx, queue: str, state: str, page: int, pages: int) -> str:
    """Links to the previous and next pages of a state's jobs."""
    prev_link = (
        f'<a rel="prev" href="{e(ctx.url("/jobs", q=queue, state=state, page=page - 1))}">'
        "← previous</a>" if page > 1 else ""
    )
    next_link = (
        f'<a rel="next" href="{e(ctx.url("/jobs", q=queue, state=state, page=page + 1))}">'
        "next →</a>" if page < pages else ""
    )
    return f'<nav class="pager">{prev_link}<span>page {page} of {pages}</span>{next_link}</nav>'
