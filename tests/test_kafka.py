"""Kafka: the development broker (a real Apache Kafka in KRaft mode, started and stopped by the
project, its data under the home, listening on 127.0.0.1 only, durable across a restart) and
`seclake ship` (sensor files to topics, each line once across rotations and SIGKILLs)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pipelines.home import Home
from pipelines.kafka.broker import Broker

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
    finally:
        stopped = seclake("kafka", "stop", "--port", port, home=home)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert seclake("kafka", "stop", "--port", port, home=home).stdout.strip() == "kafka broker was not running"
    assert seclake("kafka", "status", "--port", port, home=home).returncode == 1


# ---- seclake ship: sensor files -> Kafka, each line once ----------------------------------------

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

    rng = random.Random(11)
    sensor = Sensor(tmp_path / "sensor", seed=11)
    cmd = [sys.executable, "-m", "pipelines.cli", "ship", str(sensor.folder), "--kafka", broker.bootstrap,
           "--poll", "0.1"]

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
            os.killpg(proc.pid, signal.SIGKILL)  # at whatever point it is: reading, sending, flushing
            proc.wait()
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
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert sensor.rotations >= 3
    for topic, lines in sensor.written.items():
        got = consume_with_headers(broker.bootstrap, topic, total[topic])
        assert [value for value, _ in got] == lines, f"{topic}: {len(got)} shipped, {len(lines)} written"
        if topic.startswith("zeek."):
            # Each TSV line travels with the header block that parses it.
            assert all(b"#fields\tts\tuid\tquery" in headers["seclake.zeek_header"] for _, headers in got)
        else:
            assert all("seclake.zeek_header" not in headers for _, headers in got)
