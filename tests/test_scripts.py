"""The Lua scripts and their typed front end (jobq/calls.py), checked together.

Every script compiles on the real server, has a documented header, is run by
exactly one typed method, and that method sends the arguments its header
lists; the return codes the headers name are the ones ``ScriptCode`` pins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

from jobq import Queue
from jobq.calls import (
    SCRIPT_METHODS,
    FlowNode,
    NewJob,
    QueueScripts,
    TakeArgs,
    WorkerScripts,
)
from jobq.errors import ScriptCode
from jobq.scripts import _SCRIPT_NAMES, VARIANTS, _library, function_name

LUA = Path(__file__).resolve().parent.parent / "jobq" / "lua"
Recorded = tuple[list[tuple[str, tuple[Any, ...]]], Callable[..., Any]]
SCRIPTS = sorted(p.stem for p in LUA.glob("*.lua") if not p.stem.startswith("_"))


def _header(script: str) -> str:
    text = (LUA / f"{script}.lua").read_text()
    match = re.search(r"--\[\[(.*?)\]\]", text, re.S)
    assert match, f"{script}.lua has no --[[ header ]]"
    return match.group(1)


def _argv_documented(script: str) -> tuple[int, bool]:
    """(the highest ARGV index the header names, whether more may follow)."""
    header = _header(script)
    indices = [int(i) for i in re.findall(r"ARGV\[(\d+)", header)]
    variadic = bool(re.search(r"ARGV\[\d+(\.\.|…)", header)) or "per job" in header
    return max(indices, default=0), variadic


def test_every_script_is_listed_and_has_exactly_one_method() -> None:
    assert SCRIPTS == sorted(_SCRIPT_NAMES)
    assert sorted(SCRIPT_METHODS) == SCRIPTS
    methods = list(SCRIPT_METHODS.values())
    assert len(set(methods)) == len(methods), "a method serves two scripts"
    for cls, name in methods:
        assert callable(getattr(cls, name)), (cls, name)


def test_the_library_loads_with_every_script(redis_client: redis.Redis) -> None:
    source, name = _library()
    redis_client.function_flush()
    assert redis_client.function_load(source) in (name, name.encode())
    listed = redis_client.function_list(name)
    if isinstance(listed, dict):  # a cluster client: one reply per node
        listed = next(iter(listed.values()))
    library = _fields(listed[0])
    functions = {_fields(f)["name"] for f in library["functions"]}
    assert functions == {function_name(s).encode() for s in [*SCRIPTS, *VARIANTS]}
    flags = {_fields(f)["name"]: set(_fields(f)["flags"]) for f in library["functions"]}
    # the variants differ by their flags alone
    assert flags[function_name("complete").encode()] == {b"allow-oom"}
    assert flags[function_name("completeTake").encode()] == set()
    assert flags[function_name("updateJob").encode()] == set()
    assert flags[function_name("updateJobHeld").encode()] == {b"allow-oom"}


def _fields(reply: Any) -> dict[str, Any]:
    """A FUNCTION LIST entry (a RESP2 flat list or a RESP3 map), by name."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in pairs}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_documents_itself(script: str) -> None:
    header = _header(script)
    for part in ("KEYS[1]", "Returns"):
        assert part in header, f"{script}.lua's header lacks {part}"


@pytest.fixture
def recorded(queue: Queue) -> Iterator[Recorded]:
    """A runner over the queue's real context that records each call."""
    calls: list[tuple[str, tuple[Any, ...]]] = []

    def run(script: str, *argv: Any) -> Any:
        calls.append((script, argv))
        return queue._context.run(script, *argv)

    yield calls, run


def _exercise(
    worker: WorkerScripts, q: QueueScripts, base: str = "jobq:{x}:"
) -> dict[str, Callable[[], Any]]:
    """One valid call of every method, by script."""
    packed = msgpack.packb(1)
    new = NewJob("", "n", packed, msgpack.packb({}), 0, 0, False, 1, -1, 0, -1, 0,
                 ("", 0, "0", "0"))
    return {
        "moveToActive": lambda: worker.take(TakeArgs("tok", 1000, "w", 0, 0)),
        "complete": lambda: worker.complete("nope", "tok", packed, None),
        "fail": lambda: worker.fail("nope", "tok", "r", msgpack.packb([]), 0, None),
        "extendLocks": lambda: worker.extend_locks(1000, [("nope", "tok")]),
        "stalledCheck": lambda: worker.stalled_check(1, 0, 10),
        "add": lambda: q.add([new]),
        "addFlow": lambda: q.add_flow([FlowNode(base, 0, new)]),
        "emit": lambda: q.emit("custom", [("a", packed)]),
        "getCounts": q.get_counts,
        "pause": lambda: q.pause(False),
        "remove": lambda: q.remove("nope", True),
        "storeSettings": lambda: q.store_settings("", "", "", "", "t"),
        "storeShardCount": lambda: q.store_shard_count(2),
        "drain": lambda: q.drain(False, 10, 0),
        "clean": lambda: q.clean("completed", 0, 10, b""),
        "obliterate": lambda: q.obliterate(True, 10),
        "retry": lambda: q.retry("failed", 10, False),
        "promote": lambda: q.promote("nope"),
        "changeDelay": lambda: q.change_delay("nope", 10),
        "changePriority": lambda: q.change_priority("nope", 1, False),
        "updateJob": lambda: q.update_job("nope", "data", packed),
        "getMetrics": lambda: q.get_metrics("completed"),
        "heartbeat": lambda: q.heartbeat("w", 1000, "token", ("host", "h")),
        "getWorkers": q.get_workers,
        "getLogs": lambda: q.get_logs("nope", 200, 10_000, 100_000),
        "getOutcome": lambda: q.get_outcome("nope", "", "", False),
        "cancel": lambda: q.cancel("nope", "why"),
        "upsertScheduler": lambda: q.upsert_scheduler(
            "s", ("1000", "", "", "", "", "", "0"), "every=1000", "", "",
            ("tick", msgpack.packb(None), msgpack.packb({}), "", "", "", "", "", "", "", "")),
        "schedulerSync": lambda: q.scheduler_sync("s", "", "", "", ""),
        "removeScheduler": lambda: q.remove_scheduler("s"),
    }


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_method_sends_what_its_header_lists(
    script: str, recorded: Recorded, queue: Queue
) -> None:
    calls, run = recorded
    _exercise(WorkerScripts(run), QueueScripts(run), queue._context.keys.base)[script]()
    assert [name for name, _ in calls] == [script], "the method ran another script"
    sent = len(calls[0][1])
    documented, variadic = _argv_documented(script)
    optional = len(re.findall(r"ARGV\[\d+(?:\.\.\d+)?\]\s+optional", _header(script)))
    if variadic:
        assert sent >= 1 if documented else sent == 0
    else:
        # an optional tail (moveToActive's retried flag) may be sent or not
        assert documented - max(optional, 0) <= sent <= documented, (script, sent, documented)


def test_return_codes_are_pinned() -> None:
    assert {c.name: int(c) for c in ScriptCode} == {
        "ALREADY_DONE": 0, "DONE": 1, "RETRYING": 2, "CANCELLED": 3,
        "JOB_MISSING": -1, "LOCK_LOST": -2, "NOT_IN_STATE": -3, "ACTIVE_JOBS": -4,
        "COLLISION": -5,
    }
    meaning = {-1: ("no such job", "missing", "does not exist"), -2: ("lock",),
               -3: ("not delayed", "not in", "state"), -4: ("active",),
               -5: ("collides",)}
    for script in SCRIPTS:
        returns = _header(script).split("Returns", 1)[1].split("Events", 1)[0]
        # a code is "-N what it means" ("ms ..., or -1" is a value, not a code)
        for code in {int(c) for c in re.findall(r"(?<!or )(?<![\w\d])(-\d) +[a-z]", returns)}:
            assert code in {int(c) for c in ScriptCode}, (script, code)
            words = returns.lower()
            assert any(w in words for w in meaning[code]), (script, code, returns)


def test_a_library_loaded_under_jobqs_name_is_said_and_restored_by_jobq_functions_load(
    queue: Queue, redis_url: str, redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A library someone loaded under jobq's name (FUNCTION LOAD REPLACE)
    lacks jobq's functions, and loading jobq's is refused as existing: the
    calls raised the bare "Function not found" for ever. They say what
    happened now, and `jobq functions load` restores it."""
    from jobq.cli import main as cli_main
    from jobq.scripts import library_name

    queue.add("before")
    redis_client.function_load(f"#!lua name={library_name()}\nredis.register_function("
                               "'other', function() return 1 end)", replace=True)
    try:
        with pytest.raises(redis.exceptions.ResponseError,
                           match="is not jobq's .*`jobq functions load`"):
            queue.add("x")
    finally:
        assert cli_main(["--url", redis_url, "functions", "load"]) == 0
    assert "loaded jobq's functions" in capsys.readouterr().out
    queue.add("after")
    assert queue.get_job_counts("waiting") == {"waiting": 2}
