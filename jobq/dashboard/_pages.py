"""The dashboard's pages: each reads through the app's shared cache and
returns its head, live part and tail (see ``_html.layout``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._adding import MAX_JOB_NAME
from ..job import STATES, Dependencies, Job
from . import _data
from ._html import (
    MAX_SHOWN,
    Ctx,
    chart,
    e,
    form,
    pager,
    pretty,
    short,
    state_links,
    table,
    value_block,
    when,
)

if TYPE_CHECKING:
    from ..queue import Queue
    from ._app import Dashboard

#: States whose jobs can be cleaned, as ``Queue.clean`` takes them.
CLEANABLE = ("completed", "failed", "delayed", "waiting", "waiting-children")


@dataclass(frozen=True)
class Page:
    """A rendered page: its title, breadcrumbs and three parts."""

    title: str
    crumbs: list[tuple[str, str | None]]
    head: str
    live: str
    tail: str = ""


def overview(app: Dashboard, ctx: Ctx) -> Page:
    """Every known queue: counts by state, paused, workers, jobs per minute."""
    summaries = app.cache.get(("overview",), lambda: [
        _data.summary_or_refusal(app.queue(name)) for name in app.queue_names()
    ])
    rows = []
    for s in summaries:
        if isinstance(s, _data.Refused):  # one queue's key of the wrong type hides no other
            link = f'<a class="queue" href="{e(ctx.url("/queue", q=s.name))}">{e(s.name)}</a>'
            rows.append([link, f'<span class="error">Redis refused: {e(s.reason)}</span>',
                         *[""] * (len(STATES) + 2)])
            continue
        cells = [f'<a class="queue" href="{e(ctx.url("/queue", q=s.name))}">{e(s.name)}</a>'
                 + (' <span class="badge paused">paused</span>' if s.paused else "")]
        for state in STATES:
            cells.append(f'<a href="{e(ctx.url("/jobs", q=s.name, state=state))}" '
                         f'data-count="{e(state)}">{s.counts[state]}</a>')
        cells += [str(s.workers), f"{s.completed_rate:.1f}", f"{s.failed_rate:.1f}"]
        rows.append(cells)
    live = table(["queue", *STATES, "workers", "completed/min", "failed/min"], rows,
                 "No queue yet: queues appear here once a job is added to them.")
    head = "<h1>Queues</h1>"
    return Page("Queues", [("queues", None)], head, live)


def queue_page(app: Dashboard, ctx: Ctx, queue: Queue) -> Page:
    """One queue: its counts, paused flag, workers, chart and actions."""
    s = app.cache.get(("summary", queue.name), lambda: _data.summary(queue))
    q = queue.name
    status = '<span class="badge paused">paused</span>' if s.paused else \
        '<span class="badge running">running</span>'
    toggle = form(ctx, "resume", "Resume", {"q": q}) if s.paused else \
        form(ctx, "pause", "Pause", {"q": q})
    live = (
        f'<div class="status">{status} {toggle} '
        f'<a href="{e(ctx.url("/workers", q=q))}">{s.workers} live worker(s)</a> · '
        f'<a href="{e(ctx.url("/schedulers", q=q))}">{s.scheduler_count} scheduler(s)</a> · '
        f"{s.completed_rate:.1f} completed/min, {s.failed_rate:.1f} failed/min "
        f"(last {_data.RATE_MINUTES} min)</div>"
        + state_links(ctx, q, s.counts)
        + "<h2>Jobs per minute</h2>"
        + chart(s.completed_minutes, s.failed_minutes, _data.CHART_MINUTES)
    )
    tail = ""
    if not ctx.read_only:
        options = "".join(f'<option value="{e(st)}">{e(st)}</option>' for st in CLEANABLE)
        # {state} and {grace}: the form's, put in by the script as it asks
        clean = f"Delete every {{state}} job of queue {q} older than {{grace}} s, for good?"
        tail = (
            "<h2>Maintenance</h2><div class=\"actions\">"
            + form(ctx, "retry_all", "Retry all failed", {"q": q},
                   confirm=f"Retry every failed job of queue {q}? Each runs again.")
            + f'<form class="inline" method="post" action="{e(ctx.url("/action"))}" '
            f'data-confirm="{e(clean)}">'
            f'<input type="hidden" name="csrf" value="{e(ctx.csrf)}">'
            '<input type="hidden" name="action" value="clean">'
            f'<input type="hidden" name="q" value="{e(q)}">'
            f'<label>Clean <select name="state">{options}</select></label> '
            '<label>older than <input name="grace" type="number" min="0" step="any" '
            'value="3600" size="6" required> s</label> '
            '<button type="submit" class="btn danger" data-action="clean">Clean</button>'
            "</form></div>"
        )
    return Page(q, [("queues", ctx.url("/")), (q, None)], f"<h1>{e(q)}</h1>", live, tail)


def _job_actions(ctx: Ctx, q: str, job_id: str, state: str, back: str,
                 readable: bool = True) -> str:
    """The action buttons of a job; of an unreadable one only those that
    work on its id alone (retry and promote read the record first)."""
    fields = {"q": q, "id": job_id, "back": back}
    parts = []
    if readable and state in ("failed", "completed"):
        parts.append(form(ctx, "retry", "Retry", fields))
    if readable and state == "delayed":
        parts.append(form(ctx, "promote", "Promote", fields))
    if state in ("waiting", "delayed", "active"):
        parts.append(form(ctx, "cancel", "Cancel", fields, "warn",
                          confirm=f"Cancel job {job_id}? It fails, and runs no more."))
    if state != "active":
        parts.append(form(ctx, "remove", "Remove", fields, "danger",
                          confirm=f"Remove job {job_id} for good?"))
    return "".join(parts)


def jobs_page(app: Dashboard, ctx: Ctx, queue: Queue, state: str, page: int,
              back: str) -> Page:
    """One page of the jobs of one state, with a search by id."""
    q = queue.name
    found = app.cache.get(("jobs", q, state, page), lambda: _data.job_page(queue, state, page))
    counts = app.cache.get(("counts", q), queue.get_job_counts)
    rows = []
    for job in found.jobs:
        link = f'<a class="job" href="{e(ctx.url("/job", q=q, id=job.id))}">{e(job.id)}</a>'
        if isinstance(job, _data.UnreadableJob):
            rows.append([
                link, e(short(job.name, MAX_JOB_NAME)), "-", "-",
                f'<span class="error">record cannot be read: {e(short(job.error))}</span>',
                _job_actions(ctx, q, job.id, state, back, readable=False),
            ])
            continue
        if state in ("completed", "failed"):
            moment = when(job.finished_on)
        elif state == "active":
            moment = when(job.processed_on)
        elif state == "delayed":
            moment = when(found.due.get(job.id, (job.timestamp or 0) + job.delay))
        else:
            moment = when(job.timestamp)
        rows.append([
            link,
            e(short(job.name, MAX_JOB_NAME)),
            e(moment),
            str(job.attempts_made),
            e(short(job.failed_reason)),
            _job_actions(ctx, q, job.id, state, back),
        ])
    column = {"completed": "finished", "failed": "finished", "active": "started",
              "delayed": "due"}.get(state, "added")
    tabs = "".join(
        f'<a class="tab{" current" if s == state else ""}" '
        f'href="{e(ctx.url("/jobs", q=q, state=s))}">{e(s)} '
        f'<span class="n" data-count="{e(s)}">{counts[s]}</span></a>'
        for s in STATES
    )
    empty = f"No {state} job."
    beyond = ""
    if found.last_shown is not None:
        beyond = (f'<p class="note">Pages after {found.last_shown} of a sharded queue are not '
                  "shown: each would read every shard's jobs up to it. Find a job by its "
                  "id.</p>")
        if found.page > found.last_shown:
            empty = "Not shown."
    live = (
        f'<nav class="tabs">{tabs}</nav>'
        + table(["id", "name", column, "attempts", "failed reason", ""], rows, empty)
        + beyond
        + pager(ctx, q, state, found.page, found.pages)
    )
    head = (
        f"<h1>{e(q)}: {e(state)}</h1>"
        f'<form class="search" method="get" action="{e(ctx.url("/job"))}">'
        f'<input type="hidden" name="q" value="{e(q)}">'
        '<label>Job id <input name="id" required size="16"></label> '
        '<button type="submit" class="btn">Find</button></form>'
    )
    crumbs = [("queues", ctx.url("/")), (q, ctx.url("/queue", q=q)), (state, None)]
    return Page(f"{q}: {state}", crumbs, head, live)


def job_page(app: Dashboard, ctx: Ctx, queue: Queue, detail: _data.JobDetail,
             back: str) -> Page:
    """One job: its fields, data, result, progress, logs, stack traces,
    events and scheduler; of a job whose record cannot be read, its raw
    fields and why."""
    q = queue.name
    job = detail.job
    readable = isinstance(job, Job)
    actions = _job_actions(ctx, q, job.id, detail.state, back, readable)
    parts = [f'<div class="actions">{actions}</div>' if actions else ""]
    if isinstance(job, Job):
        parts += _job_sections(app, ctx, q, job, detail)
    else:
        parts.append(_unreadable_section(job))
    logs = "\n".join(detail.logs)
    shown = f" (newest {len(detail.logs)} of {detail.log_total})" \
        if detail.log_total > len(detail.logs) else ""
    parts.append(
        f"<section><h3>Logs{e(shown)}</h3>"
        + (f'<pre class="value logs">{e(logs)}</pre>' if logs else '<p class="empty">No log.</p>')
        + "</section>"
    )
    if isinstance(job, Job) and job.stacktrace:
        traces = "".join(f'<pre class="value trace">{e(t)}</pre>'
                         for t in reversed(job.stacktrace))
        parts.append(f"<section><h3>Stack traces (newest first)</h3>{traces}</section>")
    events = [
        [e(when(ev.timestamp)), f'<span class="ev">{e(ev.name)}</span>', e(ev.prev or ""),
         e(short(", ".join(f"{k}={pretty(v)}" for k, v in sorted(ev.fields.items())
                           if k != "metrics"), 300))]
        for ev in detail.timeline
    ]
    mode = queue.event_mode
    empty = (f"No event of this job among the newest {_data.TIMELINE_SCAN} of the queue's "
             "stream." if mode == "stream" else
             "The queue publishes its events (pub/sub mode): none is kept to show.")
    parts.append("<section><h3>Timeline</h3>"
                 + table(["when", "event", "previous state", "fields"], events, empty)
                 + "</section>")
    crumbs = [("queues", ctx.url("/")), (q, ctx.url("/queue", q=q)),
              (detail.state, ctx.url("/jobs", q=q, state=detail.state)
               if detail.state in STATES else None), (job.id, None)]
    return Page(f"job {job.id}", crumbs, f"<h1>Job {e(job.id)}</h1>", "".join(parts))


def _job_sections(app: Dashboard, ctx: Ctx, q: str, job: Job,
                  detail: _data.JobDetail) -> list[str]:
    """A readable job's fields, values, scheduler and flow."""
    fields = [
        ("state", f'<span class="badge state-{e(detail.state)}" data-state>'
                  f"{e(detail.state)}</span>"),
        ("name", e(short(job.name, MAX_JOB_NAME))),
        ("added", e(when(job.timestamp))),
        ("delay", e(f"{job.delay:g} s")),
        ("priority", e(job.priority)),
        ("attempts made", e(job.attempts_made)),
        ("stalled", e(job.stalled_counter)),
        ("started", e(when(job.processed_on))),
        ("finished", e(when(job.finished_on))),
        ("worker", e(job.processed_by or "-")),
    ]
    if job.failed_reason:
        fields.append(("failed reason", e(short(job.failed_reason, MAX_SHOWN))))
    if job.exc_type:
        fields.append(("exception", e(job.exc_type)))
    rows = "".join(f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in fields)
    parts = [
        f'<div class="table-wrap"><table class="fields">{rows}</table></div>',
        value_block(ctx, "Progress", job.progress, q, job.id, "progress"),
        value_block(ctx, "Data", job.data, q, job.id, "data"),
        value_block(ctx, "Result", job.return_value, q, job.id, "result"),
        value_block(ctx, "Options", job.opts, q, job.id, "opts"),
    ]
    if detail.scheduler is not None:
        sch = detail.scheduler
        schedule = f"every {sch.every:g} s" if sch.every else f"cron {sch.cron} ({sch.tz})"
        parts.append(
            f"<section><h3>Scheduler</h3><p>"
            f'<a href="{e(ctx.url("/schedulers", q=q))}">{e(sch.id)}</a>: {e(schedule)}, '
            f"next run {e(when(sch.next_run))}, {sch.count} job(s) made</p></section>"
        )
    flow = _flow_section(ctx, job.parent, detail.dependencies,
                         _members(app, app.cache.get(("names",), app.queue_names)))
    if flow:
        parts.append(flow)
    return parts


def _unreadable_section(job: _data.UnreadableJob) -> str:
    """Why a job's record cannot be read, and its raw fields as stored."""
    rows = "".join(
        f'<tr><th>{e(k)}</th><td><pre class="value">{e(short(v, MAX_SHOWN))}</pre></td></tr>'
        for k, v in sorted(job.fields.items())
    )
    return (
        f'<p class="error">This job\'s record cannot be read: {e(job.error)}</p>'
        "<section><h3>Raw fields</h3>"
        f'<div class="table-wrap"><table class="fields">{rows}</table></div></section>'
    )


#: Where a flow member "<queue>:<id>" is (see _members).
Place = Callable[[str], "tuple[str, str] | None"]


def _members(app: Dashboard, known: Sequence[str]) -> Place:
    """Where a flow member ``"<queue>:<id>"`` is: both parts may hold ':',
    so the split is where the left part names a known queue; of several
    such (queues ``a`` and ``a:b``), the one holding the job (the first
    split alone linked a child of ``a:b`` to another job, of ``a``)."""
    names = set(known)

    def place(member: str) -> tuple[str, str] | None:
        splits = [(member[:i], member[i + 1:]) for i, ch in enumerate(member)
                  if ch == ":" and member[:i] in names]
        for queue, job_id in reversed(splits[1:]):  # the longest queue name first
            if app.queue(queue).get_job_state(job_id) != "unknown":
                return queue, job_id
        return splits[0] if splits else None

    return place


def _member(ctx: Ctx, member: str, place: Place) -> str:
    """A flow member ``"<queue>:<id>"`` as a link to its job (see _members)."""
    found = place(member)
    if found is None:
        return e(member)
    return f'<a href="{e(ctx.url("/job", q=found[0], id=found[1]))}">{e(member)}</a>'


def _flow_section(ctx: Ctx, parent: tuple[str, str] | None,
                  deps: Dependencies | None, place: Place) -> str:
    """A job's place in a flow: its parent, and its children by outcome."""
    if parent is None and deps is None:
        return ""
    out = ["<section><h3>Flow</h3>"]
    if parent is not None:  # named apart: no split to make
        link = ctx.url("/job", q=parent[0], id=parent[1])
        out.append(f'<p>parent: <a href="{e(link)}">{e(f"{parent[0]}:{parent[1]}")}</a></p>')
    if deps is not None:
        rows = (
            [[_member(ctx, m, place), "completed", e(short(pretty(v), 200))]
             for m, v in sorted(deps.processed.items())]
            + [[_member(ctx, m, place), "failed (waited on)", e(short(r, 200))]
               for m, r in sorted(deps.failed.items())]
            + [[_member(ctx, m, place), "failed (ignored)", e(short(r, 200))]
               for m, r in sorted(deps.ignored.items())]
            + [[_member(ctx, m, place), "pending", ""]
               for m in sorted(deps.pending) if m not in deps.failed]
        )
        out.append(table(["child", "outcome", "result or reason"], rows, "No child."))
    out.append("</section>")
    return "".join(out)


def workers_page(app: Dashboard, ctx: Ctx, queue: Queue) -> Page:
    """The queue's live workers."""
    found = app.cache.get(("workers", queue.name), lambda: _data.workers(queue))
    rows = [[e(w.name), e(w.host), str(w.pid), e(", ".join(w.queues)), str(w.concurrency),
             str(w.jobs_active), str(w.jobs_done), str(w.jobs_failed), e(when(w.started)),
             e(when(w.last_heartbeat)), e(w.version or "unknown"),
             "paused" if w.paused else ""] for w in found]
    live = table(["name", "host", "pid", "queues", "concurrency", "active", "done", "failed",
                  "started", "last heartbeat", "jobq", ""], rows, "No live worker.")
    q = queue.name
    crumbs = [("queues", ctx.url("/")), (q, ctx.url("/queue", q=q)), ("workers", None)]
    return Page(f"{q}: workers", crumbs, f"<h1>{e(q)}: workers</h1>", live)


def schedulers_page(app: Dashboard, ctx: Ctx, queue: Queue) -> Page:
    """The queue's job schedulers."""
    found = app.cache.get(("schedulers", queue.name), lambda: _data.schedulers(queue))
    rows = []
    for s in found:
        schedule = f"every {s.every:g} s" if s.every else f"cron {s.cron} ({s.tz})"
        limit = f"{s.count} / {s.limit}" if s.limit else str(s.count)
        rows.append([e(s.id), e(schedule), e(when(s.next_run)), e(limit), e(s.name),
                     e(short(pretty(s.data)))])
    live = table(["id", "schedule", "next run", "jobs made", "job name", "data"], rows,
                 "No scheduler.")
    q = queue.name
    crumbs = [("queues", ctx.url("/")), (q, ctx.url("/queue", q=q)), ("schedulers", None)]
    return Page(f"{q}: schedulers", crumbs, f"<h1>{e(q)}: schedulers</h1>", live)
