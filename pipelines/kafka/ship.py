"""`seclake ship`: tail sensor log files as they are written and publish every line to Kafka once.

What a log shipper does between a sensor and Kafka, for Zeek's current logs (`conn.log`,
`dns.log`, `dhcp.log`, ... -> topics `zeek.conn`, `zeek.dns`, ...) and Suricata's `eve.json`
(-> `suricata.eve`):

- only complete lines are sent (a line still being written waits for its newline);
- rotation is followed: a file renamed away (Zeek's `dns.log` -> `dns.<time>.log`) is read to its
  end through the handle already open, then the new file from its start; the switch waits until
  the renamed file has had no write for `ROTATE_WAIT_S` (logrotate renames, then Suricata keeps
  writing the renamed file until it handles the HUP);
- **exactly once across restarts, with no state file**: every message carries where its line
  ended (`seclake.file`: device and inode, `seclake.end`: byte offset, `seclake.head`: a digest of
  the file's first bytes, so a new file that got a deleted file's inode is not taken for it) in
  its Kafka headers. On start, the last message of each topic says where shipping stopped; the producer is idempotent
  with `acks=all`, so a topic never holds a later line without every earlier one, and a
  restarted shipper neither skips nor repeats a line, whenever it was killed.
- Zeek TSV lines carry their file's header block (`#separator` .. `#types`) in the
  `seclake.zeek_header` header, so a consumer parses a line on its own; JSON lines need none.

One shipper per folder and topic: two shippers publishing the same files would both resume from
the same last message.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger("seclake")


class _DebugLogger(logging.Logger):
    """librdkafka's own log lines (a refused connection every second while a broker is away) at
    DEBUG, shown with `seclake -v` only: the shipper says what matters in its own words."""

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        super().log(logging.DEBUG, msg, *args, **kwargs)  # type: ignore[arg-type]


LIBRDKAFKA_LOG = _DebugLogger("seclake.librdkafka")
LIBRDKAFKA_LOG.parent = logging.getLogger("seclake")

# The files a sensor writes and their topic: Zeek `<kind>.log`, Suricata `eve.json`.
EVE = "eve.json"
HEADER_FILE, HEADER_END, HEADER_ZEEK = "seclake.file", "seclake.end", "seclake.zeek_header"
HEADER_HEAD = "seclake.head"
POLL_S = 0.5
READ_BYTES = 1 << 20
# A renamed file written this recently may still be written: logrotate renames `eve.json` (and
# creates the new one), and Suricata writes the renamed file until its HUP is handled.
ROTATE_WAIT_S = 5.0
# A file is known by its inode and its first bytes: Zeek's first ~300 bytes are its header, whose
# `#open` line holds the file's start time; an EVE line starts with its timestamp.
HEAD_BYTES = 1024


# Suricata's own text logs beside eve.json: not Zeek logs, whatever their `.log` name says.
SURICATA_LOGS = frozenset({"fast", "stats", "suricata", "drop", "alert-debug"})
# Rotated files that logrotate compressed: shipping their bytes as lines would put binary in the topic.
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4")


def topic_of(name: str) -> str | None:
    """The topic of a sensor's current log file, or None for files that are not shipped
    (rotated files: they are read only to finish what was open; Suricata's text logs).

    >>> topic_of("dns.log"), topic_of("eve.json"), topic_of("dns.2026-11-20-13-00-00.log"), topic_of("x.txt")
    ('zeek.dns', 'suricata.eve', None, None)
    >>> topic_of("stats.log"), topic_of("fast.log")
    (None, None)
    """
    if name == EVE:
        return "suricata.eve"
    stem, dot, ext = name.partition(".")
    return f"zeek.{stem}" if dot and ext == "log" and stem.isidentifier() and stem not in SURICATA_LOGS else None


def file_id(stat: os.stat_result) -> str:
    """A file's identity across renames: device and inode."""
    return f"{stat.st_dev}:{stat.st_ino}"


@dataclass
class Tail:
    """One file being shipped: its open handle, identity, position and Zeek header block."""

    topic: str
    path: Path
    handle: object
    ident: str
    pos: int = 0
    header: list[bytes] = field(default_factory=list)
    partial: bytes = b""
    head: str = ""  # the digest of the first HEAD_BYTES bytes, once the file has that many

    def fingerprint(self, end: int) -> str:
        """`<n>:<digest>` of the file's first n = min(end, HEAD_BYTES) bytes: what `seclake.head`
        carries for a line ending at `end`, and what a resumed file must still begin with."""
        if end >= HEAD_BYTES and self.head:
            return self.head
        data = os.pread(self.handle.fileno(), min(end, HEAD_BYTES), 0)  # type: ignore[attr-defined]
        digest = f"{len(data)}:{hashlib.blake2b(data, digest_size=12).hexdigest()}"
        if len(data) == HEAD_BYTES:
            self.head = digest
        return digest

    def seek(self, offset: int) -> None:
        """Go on after `offset` (a resume point); the Zeek header block above it still applies, found
        a chunk at a time (a multi-GB file resumed is not read into memory; EVE has no header)."""
        self.handle.seek(0)  # type: ignore[attr-defined]
        header: list[bytes] = []
        if self.topic.startswith("zeek."):
            rest, left = b"", offset
            while left > 0 and (chunk := self.handle.read(min(READ_BYTES, left))):  # type: ignore[attr-defined]
                left -= len(chunk)
                *complete, rest = (rest + chunk).split(b"\n")
                header = _zeek_header(complete, header)
            header = _zeek_header([rest], header)
        self.handle.seek(offset)  # type: ignore[attr-defined]
        self.header, self.pos, self.partial = header, offset, b""

    def lines(self) -> Iterator[tuple[bytes, int]]:
        """The complete lines appended since the last call, each with the offset where it ends."""
        while True:
            chunk = self.handle.read(READ_BYTES)  # type: ignore[attr-defined]
            if not chunk:
                return
            data = self.partial + chunk
            start = 0
            base = self.pos - len(self.partial)
            while (end := data.find(b"\n", start)) >= 0:
                line = data[start:end]
                yield line, base + end + 1
                start = end + 1
            self.partial = data[start:]
            self.pos = base + len(data)


def _watermarks(consumer: Any, partition: Any, timeout_s: float) -> tuple[int, int]:
    """A partition's (low, high) offsets. A broker that just restarted answers NOT_LEADER for a
    moment while it takes its partitions back, and an answer may be missing or invalid (negative)
    until it has: those are retried until `timeout_s`, never read as an empty partition (which
    would make a resumed shipper send everything again)."""
    from confluent_kafka import KafkaError, KafkaException

    passing = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError._TRANSPORT,
               KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = consumer.get_watermark_offsets(partition, timeout=max(1.0, deadline - time.monotonic()))
            if answer is not None and min(answer) >= 0:
                return int(answer[0]), int(answer[1])
            problem = f"no valid offsets yet ({answer})"
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in passing):
                raise RuntimeError(f"Kafka could not give the offsets of topic {partition.topic}: "
                                   f"{error.str()}") from None
            problem = error.str()
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kafka could not give the offsets of topic {partition.topic} within "
                               f"{timeout_s:.0f} s: {problem}")
        time.sleep(0.5)


def _partitions(consumer: Any, bootstrap: str, topic: str, timeout_s: float) -> int:
    """How many partitions `topic` has (0: the topic does not exist). Metadata that lists the topic
    with a partition still without a leader (a broker taking its partitions back after a restart)
    is asked again; an absent topic is confirmed by a second answer a second later, because
    "absent" makes a shipper start over from the oldest file."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    absent = 0
    while True:
        try:
            meta = consumer.list_topics(topic, timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            raise RuntimeError(f"Kafka at {bootstrap} did not answer within {timeout_s:.0f} s "
                               f"({exc.args[0].str()}); start it (seclake kafka start) or pass --kafka") from None
        found = meta.topics.get(topic)
        if found is None or not found.partitions:
            absent += 1
            if absent >= 2:
                return 0
        elif all(p.error is None and p.leader >= 0 for p in found.partitions.values()):
            return len(found.partitions)
        else:
            absent = 0
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kafka at {bootstrap} gave no leader for topic {topic} within {timeout_s:.0f} s")
        time.sleep(1.0)


class ResumePoint(NamedTuple):
    """Where a topic's last message says shipping stopped: the file (`file_id`), the offset its line
    ended at, and the file's `Tail.fingerprint` then (None from a shipper before it was sent)."""

    ident: str
    end: int
    head: str | None


def resume_points(bootstrap: str, topics: list[str], timeout_s: float = 30.0) -> dict[str, ResumePoint]:
    """topic -> the `ResumePoint` of the last message each topic holds (absent: never shipped)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "seclake-ship-resume",
                         "enable.auto.commit": False, "logger": LIBRDKAFKA_LOG})
    found: dict[str, ResumePoint] = {}
    try:
        for topic in topics:
            partitions = _partitions(consumer, bootstrap, topic, timeout_s)
            if partitions == 0:
                continue
            if partitions != 1:
                raise ValueError(f"topic {topic} has {partitions} partitions; "
                                 "seclake ship keeps each file's lines in order in one partition")
            low, high = _watermarks(consumer, TopicPartition(topic, 0), timeout_s)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, 0, high - 1)])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                message = consumer.poll(1.0)
                if message is None or message.error():
                    continue
                pairs: list[tuple[str, bytes]] = message.headers() or []  # type: ignore[assignment]
                headers = {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in pairs}
                if HEADER_FILE not in headers or HEADER_END not in headers:
                    raise ValueError(f"topic {topic}: its last message was not written by seclake ship (no "
                                     f"{HEADER_FILE} header); give the shipper topics of its own")
                found[topic] = ResumePoint(headers[HEADER_FILE], int(headers[HEADER_END]), headers.get(HEADER_HEAD))
                break
            else:
                raise RuntimeError(f"could not read the last message of topic {topic} within {timeout_s:.0f} s")
    finally:
        consumer.close()
    return found


class Shipper:
    """Ships the sensor files of `folder` to the Kafka at `bootstrap` until `stop` is set."""

    def __init__(self, folder: Path, bootstrap: str, rotate_wait_s: float = ROTATE_WAIT_S) -> None:
        from confluent_kafka import Producer

        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder (the sensor's log folder)")
        self.folder = folder
        self.bootstrap = bootstrap
        self.rotate_wait_s = rotate_wait_s
        # No message ever times out (message.timeout.ms=0): a line given up on while later ones
        # get through would be a line lost. A broker that is away is waited for.
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "message.timeout.ms": 0, "linger.ms": 20, "compression.type": "lz4",
                                  "logger": LIBRDKAFKA_LOG, "error_cb": self._error})
        self.away = False
        self.tails: dict[str, Tail] = {}
        self.resume: dict[str, ResumePoint] | None = None
        self.shipped = 0
        self.failure: str | None = None
        self.done: set[str] = set()  # files shipped to their end and closed (rotated)
        self.compressed: set[str] = set()  # compressed rotated files already said to be skipped
        self.said_empty = False  # a folder without any current log, said once

    def _error(self, error: object) -> None:
        from confluent_kafka import KafkaError

        assert isinstance(error, KafkaError)
        if error.fatal() and self.failure is None:
            self.failure = error.str()
        elif error.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN) and not self.away:
            self.away = True  # said once per outage; the lines wait in the producer's queue
            # librdkafka words this one "1/1 brokers are down", or "0/1" as its count moves.
            why = "no broker answers" if error.code() == KafkaError._ALL_BROKERS_DOWN else error.str()
            log.warning("Kafka at %s is unreachable (%s); lines wait until it is back", self.bootstrap, why)

    def _delivered(self, error: object, message: object) -> None:
        self.away = False
        if error is not None and self.failure is None:
            self.failure = str(error)

    def run(self, stop: threading.Event, poll_s: float = POLL_S) -> int:
        """Ship until `stop` is set, then flush; the lines shipped."""
        try:
            while not stop.is_set():
                self.step()
                stop.wait(poll_s)
            self.step()
        finally:
            self.flush()
        return self.shipped

    def step(self) -> None:
        """One pass: follow rotations, send every complete new line of every current file."""
        if self.resume is None:
            self._start()
        current = self._current()
        if not current and not self.said_empty:
            self.said_empty = True
            log.warning("no current log in %s (Zeek's conn.log, dns.log, ...; Suricata's eve.json): waiting for "
                        "one (rotated files are shipped once the current file of their kind is there)", self.folder)
        seen = {topic: self._open(topic, path) for topic, path in current.items() if topic not in self.tails}
        if seen:
            # First current files since the start (the sensor started later, or the shipper started
            # between a rotation's rename and the new file): resumed as at the start, so the rotated
            # file's rest, or every rotated file of a topic never shipped, goes first.
            try:
                self._resume(seen)
            except RuntimeError as exc:  # the broker is away: nothing of them is sent until it answers
                for tail in seen.values():
                    tail.handle.close()  # type: ignore[attr-defined]
                log.warning("%s: not shipped until the broker says where they go on (tried again next pass): %s",
                            ", ".join(sorted(seen)), exc)
                current = {topic: path for topic, path in current.items() if topic not in seen}
        for topic, path in current.items():
            tail = self.tails[topic]
            stat = path.stat()
            if tail.ident == file_id(stat) and stat.st_size < tail.pos:
                # Truncated in place (copytruncate rotation): what it held before is shipped.
                log.warning("%s was truncated; shipping it again from its start", path)
                tail.handle.seek(0)  # type: ignore[attr-defined]
                tail.pos, tail.partial = 0, b""
            if tail.ident != file_id(stat):
                self._send_lines(tail)
                if time.time() - os.fstat(tail.handle.fileno()).st_mtime < self.rotate_wait_s:  # type: ignore[attr-defined]
                    # Maybe still written: the new file's lines wait, so that the topic holds a file's
                    # lines before the next file's (a restart resumes from the topic's last message).
                    continue
                # Opened before the rotated files are listed: a rotation from here on is seen next pass.
                new = self._open(topic, path)
                self._finish(tail, new)
                tail = self.tails[topic] = new
            self._send_lines(tail)
        self.producer.poll(0)
        if self.failure is not None:
            raise RuntimeError(f"Kafka at {self.bootstrap} refused a line: {self.failure}; "
                               "the next start resumes after the last line it holds")

    def flush(self, timeout_s: float = 60.0) -> None:
        left = self.producer.flush(timeout_s)
        if self.failure is not None:
            raise RuntimeError(f"Kafka at {self.bootstrap} refused a line: {self.failure}")
        if left:
            raise RuntimeError(f"{left} message(s) not acknowledged by Kafka at {self.bootstrap} within "
                               f"{timeout_s:.0f} s; they are shipped again by the next start")

    def _current(self) -> dict[str, Path]:
        return {topic: path for path in sorted(self.folder.iterdir())
                if (topic := topic_of(path.name)) is not None and path.is_file()}

    def _start(self) -> None:
        """The first pass: hold the current files open, then resume each topic (`_resume`)."""
        self.resume = {}
        self._resume({topic: self._open(topic, path) for topic, path in self._current().items()})

    def _resume(self, held: dict[str, Tail]) -> None:
        """Resume each topic of `held` (its current file, open) after the line its last message
        holds; when that line's file was rotated since, ship the rest of it and the files rotated
        after it first. A topic never shipped to starts with the oldest file."""
        assert self.resume is not None
        self.resume.update(resume_points(self.bootstrap, sorted(held)))
        for topic, tail in held.items():
            point = self.resume.get(topic)
            if point is None:
                log.info("topic %s holds no line of %s yet: shipping its files from the oldest", topic, self.folder)
                self._ship_rotated(tail, 0)  # never shipped: everything the folder holds, oldest first
            elif self._is(tail, point):
                tail.seek(point.end)
            else:
                old = None
                for path in (p for p in self._rotated(topic) if file_id(p.stat()) == point.ident):
                    if self._is(opened := self._open(topic, path), point):
                        old = opened
                        break
                    opened.handle.close()  # type: ignore[attr-defined]
                if old is None:
                    log.warning("the file %s was last shipped from is no longer in %s (rotated elsewhere, "
                                "or deleted%s); lines it got after offset %d, and files rotated after it, were "
                                "not shipped", topic, self.folder,
                                f": {tail.path.name} has its inode but not its first bytes"
                                if point.ident == tail.ident else "", point.end)
                else:
                    old.seek(point.end)
                    self._finish(old, tail)
            self.tails[topic] = tail

    @staticmethod
    def _is(tail: Tail, point: ResumePoint) -> bool:
        """Whether `tail`'s file is the one `point` was shipped from: its inode, and (inodes are
        reused once a file is deleted) the same first bytes."""
        if tail.ident != point.ident:
            return False
        if point.head is None:
            return True
        return tail.fingerprint(int(point.head.partition(":")[0])) == point.head

    def _finish(self, tail: Tail, current: Tail) -> None:
        """`tail`'s file was rotated: ship the rest of it (its open handle still reads it), then every
        file of the topic rotated between it and the `current` one (by last write), oldest first,
        so that a rotation while the shipper was down, or two between passes, loses nothing."""
        self._send_lines(tail)
        last_write = os.fstat(tail.handle.fileno()).st_mtime_ns  # type: ignore[attr-defined]
        tail.handle.close()  # type: ignore[attr-defined]
        self.done.add(tail.ident)
        self._ship_rotated(current, last_write)

    def _ship_rotated(self, current: Tail, after_ns: int) -> None:
        """Ship, oldest first, the topic's rotated files last written from `after_ns` on and not
        after the `current` file."""
        bound = os.fstat(current.handle.fileno()).st_mtime_ns  # type: ignore[attr-defined]
        later = sorted((p.stat().st_mtime_ns, p.name, p) for p in self._rotated(current.topic)
                       if file_id(p.stat()) not in (*self.done, current.ident)
                       and after_ns <= p.stat().st_mtime_ns <= bound)
        for _, _, path in later:
            rest = self._open(current.topic, path)
            self._send_lines(rest)
            rest.handle.close()  # type: ignore[attr-defined]
            self.done.add(rest.ident)

    def _rotated(self, topic: str) -> list[Path]:
        """The topic's rotated files still in the folder: named like its current file, with more dots
        (Zeek `dns.<time>.log`, Suricata `eve.<n>.json` or `eve.json.<n>`)."""
        stem = "eve" if topic == "suricata.eve" else topic.removeprefix("zeek.")
        found = [p for p in self.folder.iterdir()
                 if p.is_file() and p.name.split(".")[0] == stem and topic_of(p.name) is None]
        for path in (p for p in found if p.name.endswith(COMPRESSED) and p.name not in self.compressed):
            self.compressed.add(path.name)
            log.warning("%s is compressed: not shipped (ship a rotated file before it is compressed: "
                        "logrotate's delaycompress)", path)
        return [p for p in found if not p.name.endswith(COMPRESSED)]

    def _open(self, topic: str, path: Path) -> Tail:
        handle = open(path, "rb")  # noqa: SIM115 - kept open across passes, closed on rotation
        return Tail(topic, path, handle, file_id(os.fstat(handle.fileno())))

    def _send_lines(self, tail: Tail) -> None:
        block = b"\n".join(tail.header)  # joined once per header change, not once per line
        for line, end in tail.lines():
            text = line.rstrip(b"\r")
            if text.startswith(b"#") and tail.topic.startswith("zeek."):
                tail.header = _zeek_header([text], tail.header)
                block = b"\n".join(tail.header)
                continue
            if not text:
                continue
            headers: list[tuple[str, str | bytes | None]] = [(HEADER_FILE, tail.ident), (HEADER_END, str(end)),
                                                             (HEADER_HEAD, tail.fingerprint(end))]
            if block:
                headers.append((HEADER_ZEEK, block))
            while True:
                try:
                    self.producer.produce(tail.topic, text, headers=headers, on_delivery=self._delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    self.producer.poll(0.5)
            self.shipped += 1


def _zeek_header(lines: list[bytes], header: list[bytes]) -> list[bytes]:
    """The Zeek header block after `lines`: a `#separator` line starts a new one; `#close` and
    `#open` are not part of it.

    >>> _zeek_header([b"#separator \\\\x09", b"#fields\\tts", b"#close\\tx"], [])
    [b'#separator \\\\x09', b'#fields\\tts']
    """
    for line in lines:
        if line.startswith(b"#separator"):
            header = [line]
        elif line.startswith(b"#") and not line.startswith((b"#open", b"#close")):
            header = [*header, line]
    return header
