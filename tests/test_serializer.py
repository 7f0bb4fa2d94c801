"""What travels in job data and results: aware datetimes, registered types,
tuples as lists; naive datetimes and unknown types refused with a reason."""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import enum
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from jobq import Job, JobFailedError, Queue, QueueEvents, SerializationError, Worker, serializer
from tests.polling import until

WAIT = 20.0
UTC = dt.timezone.utc


@pytest.fixture
def decimals() -> Iterator[None]:
    """Decimal registered under ext code 42 for the test."""
    serializer.register(decimal.Decimal, 42, lambda d: str(d).encode(),
                        lambda b: decimal.Decimal(b.decode()))
    try:
        yield
    finally:
        with serializer._registry.lock:
            serializer._registry.by_type.pop(decimal.Decimal, None)
            serializer._registry.by_code.pop(42, None)


def test_aware_datetimes_round_trip_through_a_worker_in_utc(queue: Queue) -> None:
    paris = dt.timezone(dt.timedelta(hours=1))
    when = dt.datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=paris)

    def later(job: Job) -> Any:
        assert job.data["at"] == when
        return {"at": job.data["at"] + dt.timedelta(days=1)}

    job = queue.add("remind", {"at": when})
    with Worker(queue.name, later, connection=queue.client, prefix=queue.prefix):
        result = job.wait_until_finished(timeout=WAIT)
    assert result["at"] == when + dt.timedelta(days=1)
    assert result["at"].tzinfo is UTC
    assert queue.get_job(job.id).data == {"at": when}  # type: ignore[union-attr]


def test_a_naive_datetime_is_refused_with_the_reason(queue: Queue) -> None:
    with pytest.raises(SerializationError, match="naive datetime .* timezone"):
        queue.add("remind", {"at": dt.datetime(2026, 1, 1)})
    assert queue.get_job_counts()["waiting"] == 0


@pytest.mark.parametrize("when", [
    dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),
    dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
])
def test_an_aware_datetime_outside_utc_years_1_to_9999_is_refused(
    queue: Queue, when: dt.datetime
) -> None:
    # it packs, but no process could read it back: data, result or event field
    with pytest.raises(SerializationError, match="outside years 1 to 9999 in UTC"):
        queue.add("remind", {"at": when})
    assert queue.get_job_counts()["waiting"] == 0
    with pytest.raises(SerializationError, match="outside years 1 to 9999 in UTC"):
        serializer.encoder()([when], "return value")


class FrozenDatetime(dt.datetime):
    """A datetime subclass, as freezegun and pendulum make."""


def test_an_aware_datetime_of_a_subclass_round_trips_and_a_naive_one_is_refused(
    queue: Queue,
) -> None:
    when = FrozenDatetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=dt.timezone.utc)
    job = queue.add("remind", {"at": when})
    assert queue.get_job(job.id).data == {"at": when}  # type: ignore[union-attr]
    with pytest.raises(SerializationError, match="naive datetime"):
        queue.add("remind", {"at": FrozenDatetime(2026, 1, 1)})


def test_unregistered_types_are_refused_naming_register(queue: Queue) -> None:
    with pytest.raises(SerializationError, match=r"'UUID'.*jobq\.serializer\.register"):
        queue.add("x", uuid.uuid4())


def test_registered_types_round_trip(queue: Queue, decimals: None) -> None:
    job = queue.add("sum", {"items": [decimal.Decimal("1.10"), decimal.Decimal("2.20")]})
    with Worker(queue.name, lambda j: sum(j.data["items"]), connection=queue.client,
                prefix=queue.prefix):
        assert job.wait_until_finished(timeout=WAIT) == decimal.Decimal("3.30")


def test_an_unregistered_ext_code_fails_to_decode_without_running_anything(
    decimals: None,
) -> None:
    packed = serializer.encode(decimal.Decimal("1"))
    with serializer._registry.lock:
        serializer._registry.by_code.pop(42)
    with pytest.raises(SerializationError, match="extension type 42 is not registered"):
        serializer.decode(packed)


def test_register_checks_its_arguments(decimals: None) -> None:
    with pytest.raises(ValueError, match="0 to 127"):
        serializer.register(uuid.UUID, 128, lambda u: u.bytes, lambda b: uuid.UUID(bytes=b))
    with pytest.raises(ValueError, match="registered for Decimal"):
        serializer.register(uuid.UUID, 42, lambda u: u.bytes, lambda b: uuid.UUID(bytes=b))
    with pytest.raises(TypeError):
        serializer.register(uuid.UUID, 7, "bytes", lambda b: b)  # type: ignore[arg-type]
    for native in (list, dict, str, int, dt.datetime):  # their encoder would never run
        with pytest.raises(TypeError, match="packed by msgpack itself"):
            serializer.register(native, 7, lambda v: b"", lambda b: b)
    assert 7 not in serializer._registry.by_code


def test_tuples_come_back_as_lists() -> None:
    assert serializer.decode(serializer.encode({"t": (1, (2, "x"))})) == {"t": [1, [2, "x"]]}


class Color(enum.IntEnum):
    RED = 1


class Mode(str, enum.Enum):
    FAST = "fast"


Point = collections.namedtuple("Point", "x y")


class Settings(dict):  # type: ignore[type-arg]
    pass


class Stamp(dt.datetime):
    pass


@pytest.fixture
def native_subclasses() -> Iterator[None]:
    """Subclasses of types msgpack packs natively, registered for the test."""
    kinds: list[tuple[type, Any, Any]] = [
        (Color, lambda v: str(int(v)).encode(), lambda b: Color(int(b))),
        (Mode, lambda v: v.value.encode(), lambda b: Mode(b.decode())),
        (Point, lambda v: f"{v.x},{v.y}".encode(),
         lambda b: Point(*map(int, b.decode().split(",")))),
        (Settings, lambda v: serializer.encode(dict(v)),
         lambda b: Settings(serializer.decode(b))),
        (Stamp, lambda v: v.isoformat().encode(), lambda b: Stamp.fromisoformat(b.decode())),
    ]
    for code, (cls, encode, decode) in enumerate(kinds, start=50):
        serializer.register(cls, code, encode, decode)
    try:
        yield
    finally:
        with serializer._registry.lock:
            for code, (cls, _, _) in enumerate(kinds, start=50):
                serializer._registry.by_type.pop(cls, None)
                serializer._registry.by_code.pop(code, None)


def test_registered_subclasses_of_native_types_round_trip(
    queue: Queue, native_subclasses: None
) -> None:
    """msgpack packs an int, str, tuple or dict subclass as its base type
    before asking the hook: a registered one must still come back as itself,
    through a worker and back."""
    data = {"c": Color.RED, "m": Mode.FAST, "p": [Point(1, 2)], "s": Settings(a=[Point(3, 4)]),
            "t": Stamp(2026, 1, 2, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=2)))}
    seen: list[Any] = []

    def processor(job: Job) -> Any:
        seen.append(job.data)
        return job.data

    job = queue.add("x", data)
    with Worker(queue.name, processor, connection=queue.client, prefix=queue.prefix):
        result = job.wait_until_finished(timeout=WAIT)
    for value in (seen[0], result):
        assert value == data
        assert type(value["c"]) is Color and type(value["m"]) is Mode
        assert type(value["p"][0]) is Point and type(value["s"]) is Settings
        assert type(value["s"]["a"][0]) is Point
        assert type(value["t"]) is Stamp and value["t"].utcoffset() == dt.timedelta(hours=2)


def test_unregistered_subclasses_of_native_types_travel_as_their_base() -> None:
    data = [Color.RED, Mode.FAST, Point(1, 2), Settings(k=1), collections.OrderedDict(a=(1,))]
    out = serializer.decode(serializer.encode(data))
    assert out == [1, "fast", [1, 2], {"k": 1}, {"a": [1]}]
    assert [type(v) for v in out] == [int, str, list, dict, dict]


def test_an_integer_out_of_range_says_so(queue: Queue) -> None:
    for value in (2**64, -(2**63) - 1, 10**5000):
        with pytest.raises(SerializationError, match=r"bits is out of msgpack's range"):
            queue.add("big", value)
    assert serializer.decode(serializer.encode(2**64 - 1, "data"), "data") == 2**64 - 1
    assert serializer.decode(serializer.encode(-(2**63), "data"), "data") == -(2**63)


def test_a_non_string_map_key_says_what_to_do(queue: Queue) -> None:
    for value in ({1: "a"}, {"nested": {(1, 2): "b"}}, [{None: 0}], {1.5: "c"}):
        with pytest.raises(SerializationError, match=r"a dict has the key .*; keys must be str "
                           r"or bytes"):
            queue.add("keys", value)
    assert queue.get_job_counts("waiting")["waiting"] == 0
    assert serializer.decode(serializer.encode({b"k": 1, "s": 2})) == {b"k": 1, "s": 2}


class Buggy:
    """A type whose registered encoder has a bug."""

    def __init__(self, x: Any) -> None:
        self.x = x


def test_a_registered_encoder_that_raises_is_a_serialization_error(queue: Queue) -> None:
    """An encoder raising anything but TypeError, ValueError or OverflowError
    (an AttributeError, say) came out of add() as itself, where SPEC says a
    value msgpack cannot encode raises SerializationError."""
    serializer.register(Buggy, 62, lambda v: str(v.x.real).encode(), lambda b: Buggy(int(b)))
    try:
        for encode in (lambda v: queue.add("x", v),
                       lambda v: queue.add_bulk([{"name": "x", "data": v}])):
            with pytest.raises(SerializationError,
                               match="the encoder of Buggy raised AttributeError"):
                encode({"point": Buggy("a")})
        assert queue.get_job_counts("waiting")["waiting"] == 0
        assert serializer.decode(serializer.encode(Buggy(2))).x == 2  # a good value still is
    finally:
        with serializer._registry.lock:
            serializer._registry.by_type.pop(Buggy, None)
            serializer._registry.by_code.pop(62, None)


class _Items(dict):  # type: ignore[type-arg]
    """A dict subclass whose own code fails as msgpack reads it."""

    def items(self) -> Any:
        raise RuntimeError("items refused")


def test_a_values_own_code_failing_as_it_is_packed_is_a_serialization_error(
    queue: Queue
) -> None:
    """A dict subclass whose items() raised (or a tzinfo whose utcoffset
    did) came out of add() as that error itself."""
    for encode in (lambda v: queue.add("x", v),
                   lambda v: queue.add_bulk([{"name": "x", "data": v}])):
        with pytest.raises(SerializationError, match="items refused"):
            encode({"a": _Items(b=1)})
    assert queue.get_job_counts("waiting")["waiting"] == 0


class _Refused(BaseException):
    """What a decoder of the application's raises: not an Exception."""


class Sealed:
    """A type whose decoder raises a BaseException (or SystemExit)."""


@pytest.mark.parametrize("raised", [_Refused, SystemExit])
def test_a_decoder_raising_a_base_exception_fails_the_value_not_the_thread(
    queue: Queue, raised: type[BaseException]
) -> None:
    """A decoder raising a BaseException that is no Exception (SystemExit, an
    application's own) ended the QueueEvents reader thread for good (every
    wait then ended by the 10 s re-check, no listener ran again), and made
    a worker leave the job to stall until it failed as stalled too often.
    It is now that value's SerializationError, as any decoder's error."""

    def decode(_: bytes) -> Any:
        raise raised("refused")

    serializer.register(Sealed, 61, lambda v: b"x", decode)
    try:
        with pytest.raises(SerializationError, match=f"extension type 61 raised {raised.__name__}"):
            serializer.decode(serializer.encode(Sealed()))
        heard: list[str] = []
        with QueueEvents(queue.name, connection=queue.client, prefix=queue.prefix) as events:
            events.on("completed", lambda event: heard.append(str(event.job_id)))
            assert events.wait_until_ready(WAIT)
            with Worker(queue.name, lambda job: job.data, connection=queue.client,
                        prefix=queue.prefix):
                bad = queue.add("x", Sealed())
                with pytest.raises(JobFailedError, match="SerializationError"):
                    bad.wait_until_finished(events, timeout=WAIT)
                queue.emit("custom", value=Sealed())  # read and skipped by the reader
                ok = [queue.add("x", i) for i in range(3)]
                assert [j.wait_until_finished(events, timeout=WAIT) for j in ok] == [0, 1, 2]
                assert until(lambda: set(heard) >= {j.id for j in ok}, timeout=WAIT)
            reader = [t for t in threading.enumerate() if t.name == f"jobq-events-{queue.name}"]
            assert reader and reader[0].is_alive()
    finally:
        with serializer._registry.lock:
            serializer._registry.by_type.pop(Sealed, None)
            serializer._registry.by_code.pop(61, None)
