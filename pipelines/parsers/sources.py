"""The registry of log sources: adding a source is a module with a `Source` and one line here.

Everything per source (landing folders, bronze tables, the ETL's inputs, which silver table a
kind feeds, data-quality checks) is derived from this list.
"""
from __future__ import annotations

from pipelines.parsers import suricata, zeek
from pipelines.parsers.source import Source
from pipelines.schemas import SILVER_SCHEMAS

_SOURCES: dict[str, Source] = {s.name: s for s in (zeek.SOURCE, suricata.SOURCE)}


def sources() -> tuple[Source, ...]:
    """Every registered source, in registration order.

    >>> [s.name for s in sources()][:2]
    ['zeek', 'suricata']
    """
    return tuple(_SOURCES.values())


def source_names() -> tuple[str, ...]:
    """The registered sources' names.

    >>> source_names()[:2]
    ('zeek', 'suricata')
    """
    return tuple(_SOURCES)


def get_source(name: str) -> Source:
    """The source called `name`; ValueError names an unknown one.

    >>> get_source("zeek").flows
    ('conn', 'dns')
    >>> get_source("syslog")
    Traceback (most recent call last):
    ...
    ValueError: unknown source 'syslog'; expected one of ['zeek', 'suricata']
    """
    try:
        return _SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown source {name!r}; expected one of {list(_SOURCES)}") from None


def register_source(source: Source) -> None:
    """Add a source defined outside this package (a plug-in, a test); ValueError on a clash or an
    unknown silver table.

    >>> register_source(get_source("zeek"))
    Traceback (most recent call last):
    ...
    ValueError: source 'zeek' is already registered
    """
    if source.name in _SOURCES:
        raise ValueError(f"source {source.name!r} is already registered")
    if not source.name.isidentifier() or source.name != source.name.lower():
        raise ValueError(f"source name {source.name!r} must be a lower-case identifier (it names a table)")
    unknown = sorted(set(source.silver.values()) - set(SILVER_SCHEMAS))
    if unknown:
        raise ValueError(f"source {source.name!r} feeds unknown silver table(s) {unknown}; "
                         f"known: {sorted(SILVER_SCHEMAS)}")
    _SOURCES[source.name] = source


def unregister_source(name: str) -> None:
    """Remove a source added by `register_source` (the built-in ones stay)."""
    if name in (zeek.SOURCE.name, suricata.SOURCE.name):
        raise ValueError(f"source {name!r} is built in")
    _SOURCES.pop(name, None)


def silver_feeds(table: str) -> tuple[tuple[str, str], ...]:
    """The (source, kind) pairs that feed silver `table`.

    >>> silver_feeds("silver_conn")
    (('zeek', 'conn'), ('suricata', 'flow'))
    """
    return tuple((s.name, kind) for s in _SOURCES.values() for kind, target in s.silver.items() if target == table)
