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
from pathlib import Path
from urllib.parse import quote, unquote

from pipelines.home import Home

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
    rewritten = 0
    for log in home.checkpoints.glob("*/sources/*/*"):
        if log.name.startswith(".") or not log.is_file():
            continue
        lines = log.read_text().splitlines()
        changed = 0
        for i, line in enumerate(lines[1:], start=1):
            if not line.strip():
                continue
            entry = json.loads(line)
            if not isinstance(entry, dict) or "path" not in entry:
                continue  # not a file source's log (a Kafka source keeps its offsets here)
            moved = moved_here(unquote(entry["path"].removeprefix("file://")), landing)
            if moved is not None:
                entry["path"] = "file://" + quote(moved, safe=URI_PATH_SAFE)
                try:  # a copy may not keep the time: the file as found here is the one read
                    entry["timestamp"] = int(os.stat(moved).st_mtime * 1000)
                except FileNotFoundError:
                    pass
                lines[i] = json.dumps(entry, separators=(",", ":"))
                changed += 1
        if changed:
            _replace(log, lines)
            rewritten += changed
    return rewritten + _follow_state_schemas(home)


def _follow_state_schemas(home: Home) -> int:
    """Rewrite the state schema paths that a transformWithState operator's metadata records
    absolutely (`state/<op>/_metadata/v2/<batch>`: dhcp_leases) under another home's checkpoints;
    the query cannot start otherwise once the original is gone. The number of paths rewritten."""
    checkpoints = f"file:{home.checkpoints}"
    rewritten = 0
    for metadata in home.checkpoints.glob("**/state/*/_metadata/v2/*"):
        if metadata.name.startswith(".") or not metadata.is_file():
            continue
        lines = metadata.read_text().splitlines()
        changed = 0
        for i, line in enumerate(lines[1:], start=1):
            if not line.strip():
                continue
            entry = json.loads(line)
            for store in entry.get("stateStoreInfo", []):
                paths = store.get("stateSchemaFilePaths", [])
                for k, path in enumerate(paths):
                    head, sep, rest = path.rpartition("/checkpoints/")
                    if sep and head and head + "/checkpoints" != checkpoints:
                        paths[k] = f"{checkpoints}/{rest}"
                        changed += 1
            lines[i] = json.dumps(entry, separators=(",", ":"))
        if changed:
            _replace(metadata, lines)
            rewritten += changed
    return rewritten


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
