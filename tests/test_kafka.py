"""The development Kafka broker: a real Apache Kafka (KRaft) started and stopped by the project,
its data under the home, listening on 127.0.0.1 only, durable across a restart."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
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
    import time

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
