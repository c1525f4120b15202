"""A home moved or copied to another folder keeps working: its checkpoints follow it.

Spark's file source records the absolute path of every landing file it has read, in its
checkpoint's source logs (`checkpoints/<query>/sources/<n>/<batch>`). A copy of a home would see
its own landing files as new, read them all again and write bronze twice (silver de-duplicates,
bronze keeps every line). Every run-once and stream therefore starts with `follow_move`: entries
recorded under another home's `landing/` are rewritten to this home's, and so are the state schema
files a transformWithState operator (dhcp_leases) records by absolute path. Delta tables need nothing:
their logs hold relative paths, and stream offsets name tables by id.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, unquote

from pipelines.home import Home
from pipelines.objectstore.path import ObjectPath

# Left unescaped in a URI path (RFC 3986), as Hadoop's Path.toUri writes them: an entry must equal
# the listed file's URI string for the file source to know it as read.
URI_PATH_SAFE = "/!$&'()*+,;=:@~"


def follow_move(home: Home) -> int:
    """Rewrite the file-source log entries of `home`'s checkpoints that name another home's
    landing files; the number of entries rewritten (0 for a home that never moved).

    Idempotent and safe to interrupt: each log file is replaced whole, and a second pass finds
    nothing left to rewrite.

    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     log = Path(tmp, "new", "checkpoints", "etl", "sources", "0", "0")
    ...     log.parent.mkdir(parents=True)
    ...     _ = log.write_text('v1\\n{"path":"file:///old/home/landing/zeek/dns.log","batchId":0}')
    ...     (follow_move(Home(Path(tmp, "new"))), follow_move(Home(Path(tmp, "new"))),
    ...      f"/new/landing/zeek/dns.log" in log.read_text())
    (1, 0, True)
    """
    landing = str(home.landing)

    def follow(entry: dict) -> int:
        if "path" not in entry:
            return 0  # not a file source's log (a Kafka source keeps its offsets here)
        moved = moved_here(unquote(entry["path"].removeprefix("file://")), landing)
        if moved is None:
            return 0
        entry["path"] = "file://" + quote(moved, safe=URI_PATH_SAFE)
        try:  # a copy may not keep the time: the file as found here is the one read
            entry["timestamp"] = int(os.stat(moved).st_mtime * 1000)
        except FileNotFoundError:
            pass
        return 1

    return (sum(_rewrite(log, follow) for log in home.checkpoints.glob("*/sources/*/*"))
            + _follow_state_schemas(home))


def _follow_state_schemas(home: Home) -> int:
    """Rewrite the state schema paths that a transformWithState operator's metadata records
    absolutely (`state/<op>/_metadata/v2/<batch>`: dhcp_leases) under another home's checkpoints;
    the query cannot start otherwise once the original is gone. The number of paths rewritten."""
    # As Spark records them: a URI for a lake on object storage, else a file: path.
    checkpoints = str(home.checkpoints) if isinstance(home.checkpoints, ObjectPath) else f"file:{home.checkpoints}"

    def follow(entry: dict) -> int:
        changed = 0
        for store in entry.get("stateStoreInfo", []):
            paths = store.get("stateSchemaFilePaths", [])
            for k, path in enumerate(paths):
                head, sep, rest = path.rpartition("/checkpoints/")
                if sep and head and head + "/checkpoints" != checkpoints:
                    paths[k] = f"{checkpoints}/{rest}"
                    changed += 1
        return changed

    return sum(_rewrite(metadata, follow) for metadata in home.checkpoints.glob("**/state/*/_metadata/v2/*"))


def _rewrite(path: Path, follow: Callable[[dict], int]) -> int:
    """Apply `follow` (which changes an entry in place and says how many paths it moved) to each JSON
    line after a checkpoint file's version line; replace the file whole when any moved. The count."""
    if path.name.startswith(".") or not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    changed = 0
    for i, line in enumerate(lines[1:], start=1):
        entry = json.loads(line) if line.strip() else None
        if isinstance(entry, dict) and (moved := follow(entry)):
            lines[i] = json.dumps(entry, separators=(",", ":"))
            changed += moved
    if changed:
        _replace(path, lines)
    return changed


def _replace(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.moving")
    tmp.write_text("\n".join(lines))
    # The checksum Hadoop keeps beside the file would no longer match: without it, none is checked.
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
    tmp.replace(path)


def moved_here(path: str, landing: str) -> str | None:
    """`path` under this home's `landing` when it was under another home's; None when it is here.

    >>> moved_here("/a/landing/zeek/x.log", "/b/landing"), moved_here("/b/landing/zeek/x.log", "/b/landing")
    ('/b/landing/zeek/x.log', None)
    """
    if path.startswith(landing + "/"):
        return None
    head, sep, rest = path.rpartition("/landing/")
    return f"{landing}/{rest}" if sep and head else None
