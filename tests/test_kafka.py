"""Kafka: the development broker (a real Apache Kafka in KRaft mode, started and stopped by the
project, its data under the home, listening on 127.0.0.1 only, durable across a restart) and
`seclake ship` (sensor files to topics, each line once across rotations and SIGKILLs)."""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from pipelines.home import Home
from pipelines.kafka.broker import Broker, cluster_id
from pipelines.kafka.ship import topic_of

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def broker(tmp_path):
    started = Broker(Home.resolve(tmp_path / "home").create(), free_port()).start()
    try:
        yield started
    finally:
        started.stop()


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0, "messages left undelivered"


def consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0) -> list[bytes]:
    """Every message of `topic` from the beginning, reading until `expected` came or the time is up."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expected and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append(message.value())
    finally:
        consumer.close()
    return got


def listening_addresses(pid: int) -> set[str]:
    """The local addresses `pid` listens on (TCP, IPv4 and IPv6), from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address = fields[1].split(":")[0]
                found.add(address)
    return found


def test_cluster_ids_are_valid_and_never_read_as_an_option():
    ids = {cluster_id() for _ in range(5000)}
    assert len(ids) == 5000
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)


def test_broker_round_trip_on_localhost_only_with_data_under_the_home_survives_a_restart(broker):
    topic = "zeek.dns"
    values = [f'{{"uid":"C{i}","query":"host{i}.example.com"}}'.encode() for i in range(200)]
    produce(broker.bootstrap, topic, values)
    assert consume_all(broker.bootstrap, topic, len(values)) == values

    pid = broker.pid()
    assert pid is not None
    addresses = listening_addresses(pid)
    # 127.0.0.1 as /proc writes it: 0100007F (IPv4), or IPv4-mapped in IPv6.
    assert addresses and all(a in ("0100007F", "0000000000000000FFFF00000100007F") for a in addresses), addresses
    assert (broker.folder / "data" / f"{topic}-0").is_dir()

    assert broker.stop() and broker.pid() is None
    broker.start()
    assert consume_all(broker.bootstrap, topic, len(values)) == values  # durable: nothing lost by a restart


def seclake(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args, "--home", str(home)],
                          cwd=REPO, capture_output=True, text=True, timeout=180)


def test_lag_of_a_mistyped_home_is_refused_not_all_lag(tmp_path):
    # It read as a home that had read nothing: every message in Kafka reported as lag.
    done = seclake("kafka", "lag", home=tmp_path / "nope")
    assert done.returncode == 2 and done.stderr.strip() == (
        f"seclake kafka: {tmp_path / 'nope'} is not a seclake home (no tables/ folder); is the path given "
        "(--home) or SECLAKE_HOME right?"), done.stderr


def test_cli_starts_reports_and_stops_and_names_a_taken_port(tmp_path):
    home, port = tmp_path / "home", str(free_port())
    assert seclake("kafka", "status", "--port", port, home=home).returncode == 1
    try:
        first = seclake("kafka", "start", "--port", port, home=home)
        assert first.returncode == 0 and f"started: bootstrap servers 127.0.0.1:{port}" in first.stdout, first.stderr
        again = seclake("kafka", "start", "--port", port, home=home)
        assert again.returncode == 0 and "already running" in again.stdout, again.stderr
        assert seclake("kafka", "status", "--port", port, home=home).returncode == 0
        # Another home on the same port: one line naming the port, no Java trace.
        taken = seclake("kafka", "start", "--port", port, home=tmp_path / "other")
        assert taken.returncode == 2 and f"port {port}" in taken.stderr and len(taken.stderr.splitlines()) == 1, \
            taken.stderr
        # The other home did not start it: said so, with the port in use (it said only "not running").
        other = seclake("kafka", "status", "--port", port, home=tmp_path / "other")
        assert other.returncode == 1 and other.stdout.strip() == (
            f"kafka broker of {tmp_path / 'other'} not running (port {port} is in use: a server of another "
            "home? give that --home)"), other.stdout
    finally:
        stopped = seclake("kafka", "stop", "--port", port, home=home)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    again = seclake("kafka", "stop", "--port", port, home=home)
    assert again.stdout.strip() == f"kafka broker of {home} was not running", again.stdout
    assert seclake("kafka", "status", "--port", port, home=home).returncode == 1


# ---- seclake ship: sensor files -> Kafka, each line once ----------------------------------------

def test_a_resumed_file_finds_its_zeek_header_a_chunk_at_a_time(monkeypatch):
    # The whole file up to the resume point was read into memory (a multi-GB file on restart).
    import io

    from pipelines.kafka import ship

    text = (b"#separator \\x09\n#fields\tts\tquery\n#types\ttime\tstring\n1\ta.test\n2\tb.test\n"
            b"#close\tx\n#separator \\x09\n#fields\tts\tname\n3\tc.test\n4\td.test\n")
    class Reads(io.BytesIO):
        biggest = 0

        def read(self, size: int | None = -1) -> bytes:
            self.biggest = max(self.biggest, size if size is not None and size >= 0 else len(self.getvalue()))
            return super().read(size)

    monkeypatch.setattr(ship, "READ_BYTES", 7)  # chunks that cut lines, headers included
    for offset in range(len(text) + 1):
        tail = ship.Tail("zeek.dns", Path("dns.log"), Reads(text), "1:2")
        tail.seek(offset)
        assert tail.header == ship._zeek_header(text[:offset].split(b"\n"), []), offset
        assert (tail.pos, tail.handle.tell(), tail.handle.biggest <= 7) == (offset, offset, True)
    eve = ship.Tail("suricata.eve", Path("eve.json"), io.BytesIO(b'{"a":1}\n{"b":2}\n'), "1:3")
    eve.seek(8)
    assert (eve.header, [line for line, _ in eve.lines()]) == ([], [b'{"b":2}'])


ZEEK_HEADER = ["#separator \\x09", "#set_separator\t,", "#empty_field\t(empty)", "#unset_field\t-", "#path\t{kind}",
               "#open\t2026-11-20-12-00-00", "#fields\tts\tuid\tquery", "#types\ttime\tstring\tstring"]


class Sensor:
    """Writes Zeek TSV `dns.log` and `conn.log` and Suricata `eve.json` into `folder` the way the
    sensors do: lines appended in pieces (a line is sometimes half written for a while), and files
    rotated by renaming them in place and starting new ones."""

    def __init__(self, folder: Path, seed: int) -> None:
        import random

        self.folder = folder
        self.rng = random.Random(seed)
        self.written: dict[str, list[bytes]] = {"zeek.dns": [], "zeek.conn": [], "suricata.eve": []}
        self.rotations = 0
        folder.mkdir(parents=True)
        for name in ("dns.log", "conn.log", "eve.json"):
            self._start(name)

    def _start(self, name: str) -> None:
        if name.endswith(".log"):
            header = "\n".join(ZEEK_HEADER).format(kind=name[:-4]) + "\n"
            (self.folder / name).write_text(header)
        else:
            (self.folder / name).write_text("")

    def rotate(self, name: str) -> None:
        stem, ext = name.split(".")
        path = self.folder / name
        if ext == "log":
            with open(path, "a") as out:
                out.write("#close\t2026-11-20-13-00-00\n")
        self.rotations += 1
        path.rename(self.folder / f"{stem}.{self.rotations}.{ext}")
        self._start(name)

    def write(self, n: int) -> None:
        for _ in range(n):
            name = self.rng.choice(("dns.log", "conn.log", "eve.json"))
            topic = {"dns.log": "zeek.dns", "conn.log": "zeek.conn", "eve.json": "suricata.eve"}[name]
            i = len(self.written[topic])
            if name == "eve.json":
                line = f'{{"timestamp":"2026-11-20T12:00:{i % 60:02d}Z","event_type":"dns","seq":{i}}}'
            else:
                line = f"{1795262400 + i}.5\tC{name[0]}{i:06d}\thost{i}.example.com"
            data = (line + "\n").encode()
            with open(self.folder / name, "ab") as out:
                if self.rng.random() < 0.05:  # half a line, visible for a moment
                    cut = self.rng.randint(1, len(data) - 1)
                    out.write(data[:cut])
                    out.flush()
                    time.sleep(0.02)
                    data = data[cut:]
                out.write(data)
            self.written[topic].append(line.encode())


def consume_with_headers(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0) -> list:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expected and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append((message.value(), dict(message.headers() or [])))
        # Anything beyond what was written would be a duplicate: wait a little for it.
        extra_deadline = time.monotonic() + 3
        while time.monotonic() < extra_deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append((message.value(), dict(message.headers() or [])))
    finally:
        consumer.close()
    return got


def test_ship_follows_rotation_and_loses_and_repeats_nothing_across_sigkills(broker, tmp_path):
    import random
    import signal

    from test_faults import kill_group

    rng = random.Random(11)
    sensor = Sensor(tmp_path / "sensor", seed=11)
    cmd = [sys.executable, "-m", "pipelines.cli", "ship", str(sensor.folder), "--kafka", broker.bootstrap,
           "--poll", "0.1", "--rotate-wait", "0.5"]

    def start() -> subprocess.Popen:
        return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)

    proc = start()
    try:
        for round_ in range(6):
            deadline = time.monotonic() + rng.uniform(1.0, 4.0)
            while time.monotonic() < deadline:
                sensor.write(rng.randint(5, 40))
                if rng.random() < 0.15:
                    sensor.rotate(rng.choice(("dns.log", "conn.log", "eve.json")))
                time.sleep(0.05)
            kill_group(proc)  # at whatever point it is: reading, sending, flushing
            # While it is down the sensor goes on, and sometimes rotates a file it had open.
            sensor.write(rng.randint(20, 80))
            if round_ % 2 == 0:
                sensor.rotate("dns.log")
            proc = start()
        sensor.write(200)
        total = {topic: len(lines) for topic, lines in sensor.written.items()}
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and b"stopped" in out, out[-2000:]
    finally:
        kill_group(proc)
    assert sensor.rotations >= 3
    for topic, lines in sensor.written.items():
        got = consume_with_headers(broker.bootstrap, topic, total[topic])
        assert [value for value, _ in got] == lines, f"{topic}: {len(got)} shipped, {len(lines)} written"
        if topic.startswith("zeek."):
            # Each TSV line travels with the header block that parses it.
            assert all(b"#fields\tts\tuid\tquery" in headers["seclake.zeek_header"] for _, headers in got)
        else:
            assert all("seclake.zeek_header" not in headers for _, headers in got)


def test_ship_leaves_out_suricatas_text_logs_and_compressed_rotations_and_eve_lines_carry_no_header(
        broker, tmp_path, caplog):
    """A Suricata folder as `seclake ship /var/log/suricata` finds it: eve.json, a rotation logrotate
    compressed (its bytes shipped as lines once blocked the ETL from Kafka), stats.log and fast.log
    (they went to zeek.* topics and flooded bronze_zeek and the quarantine)."""
    import gzip

    from pipelines.kafka.ship import Shipper

    folder = tmp_path / "suricata"
    folder.mkdir()
    lines = [b'{"event_type":"flow","n":%d}' % i for i in range(3)] + [b"#not a Zeek header in EVE"]
    (folder / "eve.json").write_bytes(b"\n".join(lines) + b"\n")
    (folder / "eve.json.1.gz").write_bytes(gzip.compress(b'{"event_type":"old"}\n' * 50))
    (folder / "stats.log").write_text("Date: 12/5/2026 -- 04:00:00 (uptime: 0d, 00h 01m 00s)\n")
    (folder / "fast.log").write_text("12/05/2026-04:00:00.000000  [**] [1:1:1] x [**]\n")
    with caplog.at_level("WARNING", logger="seclake"):
        shipper = Shipper(folder, broker.bootstrap)
        shipper.step()
        shipper.flush()
    assert shipper.shipped == len(lines)
    got = consume_with_headers(broker.bootstrap, "suricata.eve", len(lines))
    assert [value for value, _ in got] == lines
    assert all("seclake.zeek_header" not in headers for _, headers in got)
    from confluent_kafka.admin import AdminClient

    topics = set(AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics)
    assert not {"zeek.stats", "zeek.fast"} & topics
    assert "eve.json.1.gz is compressed: not shipped" in caplog.text


def test_ship_says_a_folder_has_no_current_log_and_ships_its_rotations_once_one_appears(broker, tmp_path, caplog):
    """The shipper started before the sensor (or between a rotation's rename and the new file): a
    current file first seen after its start went from its first line, the rotated files of its
    kind (a never-shipped topic's history, or the rest of the file shipped last) never shipped."""
    from pipelines.kafka.ship import Shipper

    folder = tmp_path / "zeek"
    folder.mkdir()
    old = [b'{"_path":"dns","n":%d}' % i for i in range(3)]
    (folder / "dns.2026-11-20-00-00-00.log").write_bytes(b"\n".join(old) + b"\n")
    with caplog.at_level("WARNING", logger="seclake"):
        shipper = Shipper(folder, broker.bootstrap)
        shipper.step()
        assert shipper.shipped == 0
        assert f"no current log in {folder}" in caplog.text
        new = [b'{"_path":"dns","n":%d}' % i for i in range(3, 5)]
        (folder / "dns.log").write_bytes(b"\n".join(new) + b"\n")
        shipper.step()
        shipper.flush()
    assert shipper.shipped == 5
    assert consume_all(broker.bootstrap, "zeek.dns", 5) == old + new


def test_ship_reads_a_renamed_file_until_the_sensor_stops_writing_it(broker, tmp_path):
    """logrotate renames eve.json and creates a new one, then Suricata writes the renamed file until
    it handles the HUP: those lines were lost once the shipper had switched to the new file."""
    import os

    from pipelines.kafka.ship import Shipper

    folder = tmp_path / "suricata"
    folder.mkdir()
    (folder / "eve.json").write_bytes(b'{"n":1}\n{"n":2}\n')
    shipper = Shipper(folder, broker.bootstrap, rotate_wait_s=60)
    shipper.step()
    (folder / "eve.json").rename(folder / "eve.json.1")
    (folder / "eve.json").write_bytes(b'{"n":4}\n')
    shipper.step()
    with open(folder / "eve.json.1", "ab") as still_open:  # before the HUP reaches Suricata
        still_open.write(b'{"n":3}\n')
    shipper.step()
    assert shipper.shipped == 3  # the new file waits while the renamed one may still be written
    quiet = time.time() - 61
    os.utime(folder / "eve.json.1", (quiet, quiet))
    shipper.step()
    shipper.flush()
    got = consume_with_headers(broker.bootstrap, "suricata.eve", 4)
    assert [value for value, _ in got] == [b'{"n":%d}' % i for i in range(1, 5)]
    assert all(headers["seclake.head"].startswith(b"%d:" % min(int(headers["seclake.end"]), 1024))
               for _, headers in got)


def test_ship_resumes_a_file_with_the_shipped_files_inode_but_other_bytes_from_its_start(broker, tmp_path, caplog):
    """A file deleted while the shipper was down gives its inode to the next new file (here: the same
    inode rewritten): resuming at the old offset skipped the new file's first lines."""
    from pipelines.kafka.ship import Shipper

    folder = tmp_path / "zeek"
    folder.mkdir()
    (folder / "dns.log").write_bytes(b'{"_path":"dns","n":1}\n{"_path":"dns","n":2}\n')
    first = Shipper(folder, broker.bootstrap)
    first.step()
    first.flush()
    fresh = [b'{"_path":"dns","n":%d,"file":"new"}' % i for i in range(10, 14)]
    with open(folder / "dns.log", "r+b") as same_inode:
        same_inode.write(b"\n".join(fresh) + b"\n")
    with caplog.at_level("WARNING", logger="seclake"):
        again = Shipper(folder, broker.bootstrap)
        again.step()
        again.flush()
    assert "dns.log has its inode but not its first bytes" in caplog.text
    assert consume_all(broker.bootstrap, "zeek.dns", 6)[2:] == fresh


# ---- the ETL from Kafka: topics -> bronze, quarantine, silver, exactly the file path's rows ------

def sensor_folders(gen: Path, manifest: dict, root: Path) -> set[Path]:
    """The generator's files appended in delivery order to two sensors' current log files."""
    from sample_data.generator import append_as_current

    return {append_as_current(gen, f, root) for f in manifest["files"]}


def ship_all(folder: Path, bootstrap: str, resumed: list | None = None) -> int:
    """Every line of `folder` to Kafka through `seclake ship`'s Shipper; the lines shipped. The
    points it resumed from are appended to `resumed`, to name them when a count is off."""
    from pipelines.kafka.ship import Shipper

    shipper = Shipper(folder, bootstrap)
    shipper.step()
    shipper.flush()
    if resumed is not None:
        resumed.append((folder.name, shipper.resume, shipper.shipped))
    return shipper.shipped


def raw_lines(spark, home: Home, table: str):
    import collections

    return collections.Counter(r.raw for r in spark.read.format("delta").load(str(home.table(table)))
                               .select("raw").collect())


def lag_tick(home: Home):
    """One tick of Dagster's kafka_lag_sensor on `home`."""
    from dagster import DagsterInstance, build_sensor_context

    from assets.automation import kafka_lag_sensor
    from assets.resources import LakeResource

    context = build_sensor_context(instance=DagsterInstance.ephemeral(),
                                   resources={"lake": LakeResource(home=str(home.root))})
    return kafka_lag_sensor(context)


def test_etl_from_kafka_writes_the_same_rows_as_the_file_path_once(spark, broker, small_input, local_reference,
                                                                   tmp_path, monkeypatch):
    from pipelines import etl
    from pipelines.jobs import run_once
    from pipelines.kafka.lag import consumer_lag
    from pipelines.lake.registry import Lake
    from pipelines.settings import Settings
    from test_faults import assert_nothing_late, compare_with_reference, row_keys

    gen, manifest = small_input
    shipped = sum(ship_all(folder, broker.bootstrap) for folder in sensor_folders(gen, manifest, tmp_path))
    assert shipped > 5000
    monkeypatch.setenv("SECLAKE_KAFKA", broker.bootstrap)
    home = Home(tmp_path / "lake").create()  # tmp_path/home is the broker's
    shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
    # Before the ETL, every shipped line is lag; the Dagster sensor shows it and asks for a run.
    lag_before = consumer_lag(home, broker.bootstrap)
    assert sum(lag_before.values()) == shipped
    [first] = lag_tick(home).run_requests
    assert first.tags["seclake/kafka_lag"] == str(shipped)
    # Small batches: the offsets of several micro-batches, each committed with its own txn version.
    settings = Settings().with_overrides({"max_offsets_per_trigger": "2000"})
    reports = {r.name: r for r in run_once(spark, Lake(home), settings)}
    assert all(r.error is None for r in reports.values()), [r.line() for r in reports.values()]
    assert reports["etl_kafka"].batches >= 3
    assert_nothing_late(home)
    # Silver, enriched by event id and alerts by alert id: exactly the rows of the run over the files.
    assert row_keys(local_reference.table("alerts"), "alerts"), "the reference raised no alert: a vacuous check"
    compare_with_reference(home, local_reference, manifest,
                           exact=(*(t for t in etl.etl_tables() if t.startswith("silver_")), "alerts"))
    # Bronze and quarantine: the same raw lines; each names its message (topic, partition, offset).
    for table in (t for t in etl.etl_tables() if not t.startswith("silver_")):
        assert raw_lines(spark, home, table) == raw_lines(spark, local_reference, table), table
    sample = spark.read.format("delta").load(str(home.table("bronze_zeek"))).select("file", "line_number").first()
    assert sample.file.startswith("kafka://zeek.") and sample.line_number >= 0

    # A second run finds nothing new: the offsets are in the checkpoint, no row is written twice.
    assert set(consumer_lag(home, broker.bootstrap).values()) == {0}
    assert "consumer lag 0" in lag_tick(home).skip_message
    [again] = run_once(spark, Lake(home), settings, only=["etl_kafka"])
    assert again.error is None and sum(again.rows_out.values()) == 0, again.line()
    compare_with_reference(home, local_reference, manifest,
                           exact=(*(t for t in etl.etl_tables() if t.startswith("silver_")), "alerts"))
    # As many new messages per partition as before the first run: the same lag, but a run is asked
    # for (a run key of the lag alone was the first one's, and Dagster dropped the request).
    for partition, waiting in lag_before.items():
        produce(broker.bootstrap, partition.rsplit("/", 1)[0], [b"x"] * waiting)
    assert consumer_lag(home, broker.bootstrap) == lag_before
    assert lag_tick(home).run_requests[0].run_key != first.run_key


def test_etl_from_kafka_names_an_unreachable_broker_in_one_line(tmp_path):
    env = {**os.environ, "SECLAKE_KAFKA": f"127.0.0.1:{free_port()}"}
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "run-once", "--home", str(tmp_path / "home"),
                           "--only", "etl_kafka"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert f"no Kafka broker answers at {env['SECLAKE_KAFKA']}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "at org.apache" not in done.stderr


def end_offset(bootstrap: str, topic: str) -> int:
    """The offset after the last message of `topic`'s one partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    finally:
        consumer.close()


class SensorFeed:
    """The generator's hourly files appended one at a time to two sensors' current log files
    (`append_as_current`), each shipped at once: a sensor writing while the ETL reads."""

    def __init__(self, gen: Path, manifest: dict, root: Path, bootstrap: str) -> None:
        self.gen = gen
        self.files = list(manifest["files"])
        self.root = root
        self.bootstrap = bootstrap
        self.resumed: list = []  # (sensor, resume points, lines shipped) per shipper start

    def next(self, n: int = 1) -> None:
        from sample_data.generator import append_as_current

        for f in self.files[:n]:
            ship_all(append_as_current(self.gen, f, self.root), self.bootstrap, self.resumed)
        del self.files[:n]


@pytest.mark.faults
@pytest.mark.timeout(1800)
def test_sigkill_of_the_kafka_etl_and_of_the_broker_loses_and_duplicates_nothing(broker, small_input,
                                                                                  local_reference, tmp_path):
    import random
    import signal

    from pipelines import etl
    from test_faults import (
        KILL_WATERMARKS,
        assert_no_duplicates,
        assert_nothing_late,
        commit_files,
        compare_with_reference,
        kill_group,
        row_keys,
        wait_for_commit,
        wait_to_kill,
    )

    gen, manifest = small_input
    rng = random.Random(15)
    home = Home(tmp_path / "lake").create()  # tmp_path/home is the broker's
    shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
    env = {**os.environ, "SECLAKE_KAFKA": broker.bootstrap}
    feed = SensorFeed(gen, manifest, tmp_path / "sensors", broker.bootstrap)
    feed.next(2)
    cmd = [sys.executable, "-m", "pipelines.cli", "stream", "--home", str(home.root), "--only", "tables",
           "--set", "trigger_interval=1 second", "--set", "max_offsets_per_trigger=700", *KILL_WATERMARKS,
           "--report-every", "5"]
    kills = []
    # Kill points, in a cycle: 0-3 s after an ETL commit of this run (each cycle makes progress);
    # while Spark starts and the queries resume; 2-12 s after the session is up; and the broker
    # itself SIGKILLed and restarted under a running stream, which must then go on by itself.
    modes = ("after a commit", "from start", "after Spark up", "broker")
    for restart, mode in enumerate((*modes, "after a commit")):
        log = tmp_path / f"stream-{restart}.log"
        before = {t: commit_files(home.table(t)) for t in etl.etl_tables()}
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        try:
            feed.next(1)
            wait_to_kill(mode, proc, log, home, before, rng, up_line="seclake stream --only tables: home",
                         after_up_s=(2, 12))
            if mode == "broker":
                os.kill(broker.pid(), signal.SIGKILL)
                time.sleep(rng.uniform(1, 5))
                broker.start()
                feed.next(1)
                # The stream reconnects by itself: a further ETL commit from the topics.
                after = {t: commit_files(home.table(t)) for t in etl.etl_tables()}
                wait_for_commit(home, after, proc)
                assert any(commit_files(home.table(t)) > n for t, n in after.items()), \
                    f"no ETL commit after the broker came back:\n{log.read_text(errors='replace')[-3000:]}"
            kill_group(proc, log)
        finally:
            kill_group(proc)
        assert_no_duplicates(home, f"restart {restart} ({mode})")
        kills.append((mode, sum(commit_files(home.table(t)) - n for t, n in before.items())))
    assert sum(n for _, n in kills) >= 3, f"too few ETL commits during the kill phase: {kills}"
    feed.next(len(feed.files))
    # The topics hold each written line once: what the ETL must then read once.
    for path in sorted((tmp_path / "sensors").glob("*/*")):
        topic = topic_of(path.name)
        written = sum(1 for line in path.read_bytes().split(b"\n") if line.strip() and not line.startswith(b"#"))
        held = end_offset(broker.bootstrap, topic)
        assert held == written, f"{topic}: {held} messages, {written} lines written; shipper starts: {feed.resumed}"
    drained = subprocess.run([sys.executable, "-m", "pipelines.cli", "run-once", "--home", str(home.root),
                              *KILL_WATERMARKS], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert drained.returncode == 0, drained.stdout[-3000:] + drained.stderr[-3000:]
    assert_nothing_late(home)
    silver = tuple(t for t in etl.etl_tables() if t.startswith("silver_"))
    compare_with_reference(home, local_reference, manifest, exact=(*silver, "alerts"))
    for table in (t for t in etl.etl_tables() if t not in silver):
        got, ref = row_keys(home.table(table), table), row_keys(local_reference.table(table), table)
        assert sum(got.values()) == sum(ref.values()), \
            f"{table}: {sum(got.values())} rows, the files gave {sum(ref.values())}; shipper starts: {feed.resumed}"
    print("\nKafka kills (mode, ETL commits):", kills)


# ---- the real-time path: the IDS topic -> seclake.alerts, per event, the micro-batch path's alert ids --

def eve_alert(ts: datetime, src_ip: str, sid: int, severity: int) -> bytes:
    """A Suricata EVE alert line as Suricata writes it."""
    stamp = ts.strftime("%Y-%m-%dT%H:%M:%S.%f") + "+0000"
    return json.dumps({"timestamp": stamp, "event_type": "alert", "src_ip": src_ip, "src_port": 51000,
                       "dest_ip": "198.51.100.7", "dest_port": 443, "proto": "TCP", "host": "ids-1",
                       "alert": {"action": "allowed", "gid": 1, "signature_id": sid, "rev": 1,
                                 "signature": f"test signature {sid}", "category": "Test", "severity": severity}
                       }, separators=(",", ":")).encode()


def expected_alert_id(rule, src_ip: str, mac: str, sid: int, ts: datetime) -> str:
    """The alert id the rule's window holding `ts` gets (pipelines/rules/alerts.py), computed here
    on its own: sha256 of rule id, version, keys and the window's bounds in microseconds."""
    import hashlib

    width = 600  # the rule's 10-minute window
    start = int(ts.timestamp()) // width * width
    parts = [rule.id, str(rule.version), src_ip, mac, str(sid), str(start * 10**6), str((start + width) * 10**6)]
    return hashlib.sha256("\u001f".join(parts).encode()).hexdigest()[:32]


def test_realtime_path_sends_each_matching_event_with_the_micro_batch_alert_id(spark, broker, small_input,
                                                                               local_reference, tmp_path):
    from confluent_kafka import Consumer

    from pipelines import realtime
    from pipelines.lake.registry import Lake
    from test_faults import read_columns

    gen, manifest = small_input
    home = Home(tmp_path / "processed")  # tmp_path/home is the broker's
    shutil.copytree(local_reference.root, home.root)
    [rule] = realtime.realtime_rules()
    # Crafted alerts, attributed through dhcp_leases as the micro-batch path would: one per
    # (device, lease piece) inside its piece, priority 1 (alerts) and priority 3 (does not), and
    # one from an address no lease holds (no device: no alert).
    leases = read_columns(home.table("dhcp_leases"), ["ip", "mac", "valid_from", "valid_to"])
    devices = {line.split(",")[0] for line in (home.reference / "devices.csv").read_text().splitlines()[1:]}
    crafted, expected = [], set()
    pieces = sorted(zip(leases["ip"], leases["mac"], leases["valid_from"], leases["valid_to"]), key=lambda p: p[2])
    for n, (ip, mac, start, end) in enumerate(p for p in pieces if p[1] in devices):
        if n % 5:
            continue
        ts = start + (end - start) / 2
        crafted += [eve_alert(ts, ip, 9000 + n, 1), eve_alert(ts, ip, 9500 + n, 3)]
        expected.add(expected_alert_id(rule, ip, mac, 9000 + n, ts))
    crafted.append(eve_alert(pieces[-1][2], "10.254.254.254", 9999, 1))
    assert len(expected) >= 5
    # The reference run's own alerts of this rule, from the generated capture, are expected too.
    ref = read_columns(local_reference.table("alerts"), ["alert_id", "rule_id"])
    expected |= {a for a, r in zip(ref["alert_id"], ref["rule_id"]) if r == rule.id}
    capture = [line for path in sorted((gen / "landing" / "suricata").glob("eve*.json"))
               for line in path.read_bytes().splitlines() if line]

    query = realtime.start(spark, Lake(home), broker.bootstrap, [rule], checkpoint_every="10 seconds")
    try:
        # It starts at the topic's end: wait until it has fixed its first offsets.
        deadline = time.monotonic() + 120
        while not (home.checkpoints / realtime.QUERY_NAME / "offsets" / "0").is_file():
            assert query.isActive and time.monotonic() < deadline, \
                f"the real-time query did not start: {query.exception()}"
            time.sleep(0.5)
        produce(broker.bootstrap, "suricata.eve", [*capture, *crafted, b"{not json"])
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"test-{uuid.uuid4()}",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([realtime.ALERTS_TOPIC])
        got: dict[str, dict] = {}
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline and set(got) != expected:
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    got[message.key().decode()] = json.loads(message.value())
            # Anything beyond the expected ids would be a wrong alert: wait a little for it.
            end = time.monotonic() + 5
            while time.monotonic() < end:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    got[message.key().decode()] = json.loads(message.value())
        finally:
            consumer.close()
        assert query.isActive, query.exception()
    finally:
        query.stop()
    assert set(got) == expected, f"{len(set(got) - expected)} unexpected, {len(expected - set(got))} missing"
    assert all(m["rule_id"] == rule.id and m["device"] and m["mac"] for m in got.values())
