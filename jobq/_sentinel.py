"""Redis Sentinel: a master named by its Sentinels, from a URL or a client.

A client from ``Sentinel.master_for`` (or a ``redis+sentinel://`` URL) asks
the Sentinels for the master's address on each new connection, and drops a
connection whose server answers READONLY (a master demoted by a failover).
jobq's own clients (blocking reads, a worker's pool) are cloned from it
with a pool of the same kind, so they follow a failover as the caller's do,
asking the Sentinels through clients of their own (see ``clone_pool``).
"""

from __future__ import annotations

import re
import weakref
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

#: URL schemes that name a master by its Sentinels, and the scheme of its
#: own connections (``rediss``: TLS to the master and to the Sentinels).
SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
#: A Sentinel's port when the URL gives none.
DEFAULT_PORT = 26379

# The Sentinel managers jobq made (for a URL, or a clone): closing the
# master's client closes their connections to the Sentinels too, and
# cutting it cuts them.
_own: weakref.WeakSet[Sentinel] = weakref.WeakSet()

_FORM = ("redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]"
         "[?option=value...]")


def _hosts(text: str, url: str) -> list[tuple[str, int]]:
    hosts = []
    for item in text.split(","):
        host, colon, port = item.rpartition(":")
        if not colon or host.endswith(":"):  # no port, or a bare IPv6 address
            host, port = item, str(DEFAULT_PORT)
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port.isdigit():
            raise ValueError(f"bad Sentinel address {item!r} in {url!r}; the form is {_FORM}")
        hosts.append((unquote(host), int(port)))
    return hosts


def sentinel_client(url: str) -> redis.Redis:
    """A client of the master that the URL's Sentinels name.

    The form is ``redis+sentinel://[[user]:password@]host[:port][,host[:port]
    ...]/service[/db][?option=value...]`` (``rediss+sentinel://`` for TLS).
    The user, password, ``db`` and options (those of a ``redis://`` URL:
    ``socket_timeout``, ``protocol``, ...) are the master's; the Sentinels
    get the socket and TLS options, and ``sentinel_username`` /
    ``sentinel_password`` when they need a login of their own.

    Raises:
        ValueError: the URL is not of that form.
    """
    scheme, _, rest = url.partition("://")
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    auth, at, hosts = netloc.rpartition("@")
    names = [unquote(part) for part in path.split("/") if part]
    if not hosts or not 1 <= len(names) <= 2 or (len(names) == 2 and not names[1].isdigit()):
        raise ValueError(f"bad Sentinel URL {url!r}; the form is {_FORM}")
    options = dict(parse_qsl(query))
    own_login = {key.removeprefix("sentinel_"): options.pop(key)
                 for key in ("sentinel_username", "sentinel_password") if key in options}
    base = f"{SENTINEL_SCHEMES[scheme]}://{auth}{at}localhost/{names[1] if len(names) == 2 else 0}"
    kwargs = parse_url(f"{base}?{urlencode(options)}" if options else base)  # type: ignore[no-untyped-call, unused-ignore]
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    tls = kwargs.pop("connection_class", None) is not None  # SSLConnection, for rediss
    to_sentinels = {key: value for key, value in kwargs.items()
                    if key.startswith(("socket_", "ssl_"))}
    if tls:
        to_sentinels["ssl"] = True
    manager = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        _hosts(hosts, url), sentinel_kwargs={**to_sentinels, **own_login}, **kwargs)
    _own.add(manager)
    client: redis.Redis = manager.master_for(names[0], ssl=tls)  # type: ignore[no-untyped-call, unused-ignore]
    return client


def is_sentinel(client: Any) -> bool:
    """Whether ``client`` finds its master through Sentinels."""
    return isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool)


def clone_pool(pool: SentinelConnectionPool, max_connections: int,
               kwargs: dict[str, Any]) -> SentinelConnectionPool:
    """A pool of its own for ``pool``'s service, with the connection
    settings ``kwargs`` (from ``pool.connection_kwargs``), asking the same
    Sentinels through clients of its own without client-level retries:
    redis-py's default retries a Sentinel that does not answer for about 4
    s, which would hold a thread past ``close()``; jobq's loops retry."""
    kwargs = {key: value for key, value in kwargs.items() if key != "connection_pool"}
    theirs = pool.sentinel_manager
    addresses = [(s.connection_pool.connection_kwargs.get("host", "localhost"),
                  s.connection_pool.connection_kwargs.get("port", DEFAULT_PORT))
                 for s in theirs.sentinels]
    manager = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        addresses, min_other_sentinels=theirs.min_other_sentinels,
        sentinel_kwargs={**theirs.sentinel_kwargs, "retry": Retry(NoBackoff(), 0)},
        force_master_ip=getattr(theirs, "_force_master_ip", None),
    )
    _own.add(manager)
    return SentinelConnectionPool(  # type: ignore[no-untyped-call, unused-ignore]
        pool.service_name, manager, is_master=pool.is_master,
        check_connection=pool.check_connection, connection_class=pool.connection_class,
        max_connections=max_connections, **kwargs,
    )


def sentinel_clients(client: Any) -> list[redis.Redis]:
    """The clients of the Sentinels that ``client`` asks for its master."""
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    return list(getattr(manager, "sentinels", ()))


def own_sentinels(client: Any) -> list[redis.Redis]:
    """The clients of the Sentinels ``client`` asks, when jobq made them (for
    a URL, or a clone), else none."""
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    return list(manager.sentinels) if manager is not None and manager in _own else []


def close_own(client: Any) -> None:
    """Close the connections to the Sentinels of a client jobq made."""
    for sentinel in own_sentinels(client):
        sentinel.close()


def describe(client: Any) -> str:
    """``redis+sentinel://host:port,.../service/db``, without passwords."""
    pool = client.connection_pool
    hosts = []
    for sentinel in sentinel_clients(client):
        kwargs = sentinel.connection_pool.connection_kwargs
        host = str(kwargs.get("host", "localhost"))
        hosts.append(f"{f'[{host}]' if ':' in host else host}:{kwargs.get('port', DEFAULT_PORT)}")
    scheme = "rediss+sentinel" if "SSL" in pool.connection_class.__name__ else "redis+sentinel"
    db = pool.connection_kwargs.get("db", 0)
    return f"{scheme}://{','.join(hosts)}/{pool.service_name}/{db}"


def refused_by_sentinels(exc: BaseException) -> bool:
    """Whether ``exc`` is a MasterNotFoundError of Sentinels that each
    refused the login (a wrong ``sentinel_password``): redis-py says so only
    in the errors it lists after the message."""
    if not isinstance(exc, MasterNotFoundError):
        return False
    listed = str(exc).partition(" : ")[2]  # "AuthenticationError(...)", or in redis-py 8
    return (re.search(r"(?<![A-Za-z])AuthenticationError\b", listed) is not None  # "auth:..."
            and not re.search(r"(?<![A-Za-z])(ConnectionError|TimeoutError|ResponseError)\b",
                              listed))


def brief(exc: BaseException) -> str:
    """An error's text for a log line: a MasterNotFoundError's without the
    repr of each Sentinel's client that redis-py appends to it (over a
    thousand characters each)."""
    text = str(exc)
    return text.split(" : ", 1)[0] if isinstance(exc, MasterNotFoundError) else text
