"""What a Structured Streaming checkpoint says about its batches, read from its files (no JVM).

Spark writes `offsets/<n>` before batch n runs (line 1 the log version, line 2 the batch's
metadata such as its watermark, then one offset per source of the plan, in plan order) and
`commits/<n>` once batch n is committed (the log version, then the watermark the next batch
uses). Logs may be compacted into `<n>.compact`; `.crc` files are hidden. Local folders and
object-store prefixes (`as_path`) read the same.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.objectstore.path import as_path


@dataclass(frozen=True)
class Batch:
    """One batch of a checkpoint's offset log: its number, metadata and per-source offsets.

    `offsets` holds each source's offset as Spark wrote it (parsed JSON), in plan order; a source
    used twice in the plan repeats.
    """

    number: int
    metadata: dict[str, Any]
    offsets: list[Any]


def numbered(folder: str | os.PathLike) -> dict[int, Path]:
    """Spark's log files in `folder` by batch number (`7`, `9.compact`).

    >>> numbered("/tmp/no-such-log")
    {}
    """
    found = {}
    path = as_path(folder)
    if path.is_dir():
        for entry in path.iterdir():
            stem = entry.name.removesuffix(".compact")
            if stem.isdigit():
                found[int(stem)] = entry
    return found


def newest(checkpoint: str | os.PathLike, *, committed: bool = False) -> int | None:
    """The newest batch the checkpoint planned (`offsets/`), or with `committed` the newest it
    committed (`commits/`); None before its first.

    >>> newest("/tmp/no-such-checkpoint") is None
    True
    """
    return max(numbered(as_path(checkpoint) / ("commits" if committed else "offsets")), default=None)


def read_batch(checkpoint: str | os.PathLike, number: int) -> Batch:
    """Batch `number` of the checkpoint's offset log; ValueError naming the file when it is
    missing or not Spark's format.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Path(tmp, "offsets").mkdir()
    ...     _ = Path(tmp, "offsets", "3").write_text('v1\\n{"batchWatermarkMs":5}\\n{"zeek.dns":{"0":42}}\\n1')
    ...     read_batch(tmp, 3)
    Batch(number=3, metadata={'batchWatermarkMs': 5}, offsets=[{'zeek.dns': {'0': 42}}, 1])
    """
    path = as_path(checkpoint) / "offsets" / str(number)
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return Batch(number, json.loads(lines[1]), [json.loads(line) for line in lines[2:]])
    except FileNotFoundError:
        raise ValueError(f"{path}: no such batch in the checkpoint") from None
    except (IndexError, ValueError) as exc:
        raise ValueError(f"{path}: not a Spark offset log ({exc})") from None


def next_watermark_ms(checkpoint: str | os.PathLike, number: int) -> int:
    """The watermark (ms) committed batch `number` hands to the next batch (0 when none is set)."""
    lines = (as_path(checkpoint) / "commits" / str(number)).read_text().splitlines()
    return int(json.loads(lines[1]).get("nextBatchWatermarkMs", 0)) if len(lines) > 1 else 0


def state_key(checkpoint: str | os.PathLike, store: str, operator: int = 0) -> list[str] | None:
    """The key's field names of a stateful operator's state store, from its schema file
    (`state/<operator>/0/<store>/_metadata/schema`: Spark's version, then the key's and the value's
    schema as JSON); None before the operator wrote state. ValueError naming the file when it is
    not Spark's format.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     meta = Path(tmp, "state", "0", "0", "left-keyToNumValues", "_metadata"); meta.mkdir(parents=True)
    ...     key = '{"type":"struct","fields":[{"name":"field0","type":"string","nullable":true,"metadata":{}}]}'
    ...     _ = (meta / "schema").write_text(f"v2\\n{key}\\n{key}")
    ...     found = state_key(tmp, "left-keyToNumValues"), state_key(tmp, "right-keyToNumValues")
    ...     _ = (meta / "schema").write_text("v2 cut short")
    ...     try:
    ...         state_key(tmp, "left-keyToNumValues")
    ...     except ValueError as exc:
    ...         error = str(exc).split("/left-keyToNumValues/")[1]
    >>> found, error
    ((['field0'], None), '_metadata/schema: not a Spark state schema (substring not found)')
    """
    path = as_path(checkpoint) / "state" / str(operator) / "0" / store / "_metadata" / "schema"
    try:
        # Binary length prefixes sit between the parts: the key's schema is the first JSON object.
        text = path.read_text(errors="replace")
        key, _ = json.JSONDecoder().raw_decode(text, text.index("{"))
        return [field["name"] for field in key["fields"]]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a Spark state schema ({exc})") from None


def source_files(checkpoint: str | os.PathLike) -> dict[str, int]:
    """Every file the checkpoint's file sources have planned into a batch -> that batch's number,
    as the URIs Spark records (`file:///...`), from `sources/<n>/`: the newest `<b>.compact` (it
    repeats all before it) and each batch file after it.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     log = Path(tmp, "sources", "0"); log.mkdir(parents=True)
    ...     _ = (log / "9.compact").write_text('v1\\n{"path":"file:///l/a","timestamp":1,"batchId":3}')
    ...     _ = (log / "10").write_text('v1\\n{"path":"file:///l/b","timestamp":2,"batchId":10}')
    ...     _ = (log / "4").write_text('v1\\n{"path":"file:///l/gone","timestamp":1,"batchId":4}')
    ...     source_files(tmp), source_file_times(tmp)
    ({'file:///l/a': 3, 'file:///l/b': 10}, {'file:///l/a': 1, 'file:///l/b': 2})
    """
    return {path: int(entry["batchId"]) for path, entry in _source_entries(checkpoint).items()}


def source_file_times(checkpoint: str | os.PathLike) -> dict[str, int]:
    """The same files (`source_files`) -> their modification time when planned, in milliseconds."""
    return {path: int(entry["timestamp"]) for path, entry in _source_entries(checkpoint).items()}


def _source_entries(checkpoint: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The file source log entries of the checkpoint's sources by path (`source_files`)."""
    found: dict[str, dict[str, Any]] = {}
    sources = as_path(checkpoint) / "sources"
    for source in sources.iterdir() if sources.is_dir() else ():
        for entry in _log_entries(source):
            found[entry["path"]] = entry
    return found


def _log_entries(source: Path) -> list[dict[str, Any]]:
    """One file source log's entries: its newest `<b>.compact` (it repeats all before it) and each
    batch file after it."""
    files = numbered(source)
    start = max((n for n, path in files.items() if path.name.endswith(".compact")), default=-1)
    return [entry for number in sorted(n for n in files if n >= start) for entry in _file_entries(files[number])]


def files_after(checkpoint: str | os.PathLike, batch: int) -> list[str]:
    """The files the checkpoint's file sources planned into batches after query batch `batch` (what a
    rewind to `batch` reads again), as the URIs Spark records; each source's log position at `batch`
    is in that batch's offsets (`logOffset`, in the order of `sources/<n>`).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     log = Path(tmp, "sources", "0"); log.mkdir(parents=True); Path(tmp, "offsets").mkdir()
    ...     _ = (log / "0").write_text('v1\\n{"path":"file:///l/a","timestamp":1,"batchId":0}')
    ...     _ = (log / "1").write_text('v1\\n{"path":"file:///l/b","timestamp":2,"batchId":1}')
    ...     _ = Path(tmp, "offsets", "5").write_text('v1\\n{"batchWatermarkMs":0}\\n{"logOffset":0}')
    ...     files_after(tmp, 5)
    ['file:///l/b']
    """
    ends = read_batch(checkpoint, batch).offsets
    sources = sorted(numbered(as_path(checkpoint) / "sources").items())
    found = {entry["path"] for (_, folder), end in zip(sources, ends) if isinstance(end, dict) and "logOffset" in end
             for entry in _log_entries(folder) if int(entry["batchId"]) > int(end["logOffset"])}
    return sorted(found)


def newest_source_files(checkpoint: str | os.PathLike) -> dict[str, float]:
    """The files of each file source's newest log batch (`sources/<n>/<b>`, or the `.compact` holding
    it) -> their modification time (seconds since the epoch), as the URIs Spark records.

    A file source numbers its own log, one number per query batch that took new files from it, so
    its numbers fall behind the query's batch ids once a batch takes nothing from it (an ETL batch
    of EVE files alone): the query's batch id does not name its files. Inside a `foreachBatch`
    (the next batch is not planned yet) these are every file of the running batch, plus, for a
    source that gave it none, the files of that source's last batch, committed before.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     zeek, eve = Path(tmp, "sources", "0"), Path(tmp, "sources", "1")
    ...     zeek.mkdir(parents=True); eve.mkdir()
    ...     _ = (zeek / "4").write_text('v1\\n{"path":"file:///l/conn","timestamp":1500,"batchId":4}')
    ...     _ = (eve / "9.compact").write_text('v1\\n{"path":"file:///l/eve-a","timestamp":1500,"batchId":8}\\n'
    ...                                        '{"path":"file:///l/eve-b","timestamp":2000,"batchId":9}')
    ...     newest_source_files(tmp) == {"file:///l/conn": 1.5, "file:///l/eve-b": 2.0}
    True
    """
    found: dict[str, float] = {}
    sources = as_path(checkpoint) / "sources"
    for source in sources.iterdir() if sources.is_dir() else ():
        logs = numbered(source)
        if logs:
            last = max(logs)
            for entry in _file_entries(logs[last]):
                if int(entry["batchId"]) == last:
                    found[entry["path"]] = entry["timestamp"] / 1000
    return found


def _file_entries(log_file: Path) -> list[dict[str, Any]]:
    """The entries (path, timestamp, batchId) of one file source log file, after its version line."""
    return [json.loads(line) for line in log_file.read_text().splitlines()[1:] if line.strip()]


def clear_unstarted(checkpoint: str | os.PathLike) -> list[str]:
    """Remove the temporary files a process killed while writing the checkpoint's first offset
    file left behind (hidden `.0.<uuid>.tmp` and their `.crc`); the names removed.

    With no batch planned Spark treats the query as new and refuses to start it while `offsets/`,
    `commits/` or `state/` holds any file (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), so one kill
    at that instant would stop the query for good. Nothing can have run before batch 0 was
    planned, so the leftovers hold nothing. Visible files are left for Spark to refuse: they are
    someone's data, not a leftover.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Path(tmp, "offsets").mkdir()
    ...     _ = Path(tmp, "offsets", ".0.5f1e.tmp").write_text("v1")
    ...     clear_unstarted(tmp), sorted(p.name for p in Path(tmp, "offsets").iterdir())
    (['offsets/.0.5f1e.tmp'], [])
    """
    root = as_path(checkpoint)
    if newest(root) is not None:
        return []
    removed = []
    for folder in ("offsets", "commits", "state"):
        path = root / folder
        for entry in sorted(path.iterdir()) if path.is_dir() else ():
            if entry.name.startswith(".") and entry.is_file():
                entry.unlink()
                removed.append(f"{folder}/{entry.name}")
    return removed
