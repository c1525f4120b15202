"""Webhook delivery against a real local HTTP receiver (http.server on a free port)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipelines.notify.delivery import Destination, deliver


class Receiver:
    """Answers `script[n]` to the n-th request (then 200), and keeps what it received. While
    `hold` is set, a request after the first waits for it to clear before answering."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.received: list[tuple[str, dict, int]] = []
        # Every request's key as it arrives, before any hold: what is in flight.
        self.arrived: list[str] = []
        self.hold = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.arrived.append(self.headers["Idempotency-Key"])
                while outer.hold.is_set() and outer.received:
                    time.sleep(0.05)
                status = outer.script.pop(0) if outer.script else 200
                outer.received.append((self.headers["Idempotency-Key"], body, status))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def receiver(request) -> Iterator[Receiver]:
    found = Receiver(getattr(request, "param", []))
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()


ALERTS = [{"alert_id": f"a{n}", "severity": sev, "rule_name": "r", "src_ip": "10.0.0.5", "evidence": "e"}
          for n, sev in enumerate(["high", "low", "critical"])]


@pytest.mark.parametrize("receiver", [[500, 503]], indirect=True)
def test_failures_are_retried_with_back_off_and_each_alert_carries_its_key(receiver):
    waits: list[float] = []
    outcome = deliver(ALERTS, Destination("soc", receiver.url, "high"), sleep=waits.append)
    assert outcome.delivered == ["a0", "a2"] and outcome.dead == []  # the low one is not wanted
    assert [(key, status) for key, _, status in receiver.received] == [("a0", 500), ("a0", 503), ("a0", 200),
                                                                       ("a2", 200)]
    assert waits == [1.0, 2.0]
    assert receiver.received[0][1]["text"] == "[HIGH] r on 10.0.0.5: e"


@pytest.mark.parametrize("receiver", [[400, 500, 500, 500]], indirect=True)
def test_a_refused_payload_and_an_exhausted_alert_go_to_the_dead_letter_and_the_rest_goes_on(receiver):
    outcome = deliver(ALERTS, Destination("soc", receiver.url, "high"), max_attempts=3, sleep=lambda s: None)
    assert outcome.dead == [("a0", "HTTP 400"), ("a2", "HTTP 500")]
    assert [key for key, _, _ in receiver.received] == ["a0", "a2", "a2", "a2"]  # 400: not retried


def test_an_unreachable_receiver_is_retried_then_dead_lettered():
    closed = Receiver([])
    url = closed.url
    closed.server.server_close()  # nothing listens there any more
    outcome = deliver(ALERTS[:1], Destination("soc", url, "low"), max_attempts=2, sleep=lambda s: None)
    assert outcome.delivered == [] and outcome.dead[0][0] == "a0" and "Error" in outcome.dead[0][1]


def test_a_receiver_that_answers_no_http_is_retried_then_dead_lettered_and_the_rest_goes_on():
    # urllib raises http.client's BadStatusLine, not an OSError: it once ended the whole pass,
    # recording nothing, so every alert delivered before it was sent again on the next.
    listener = socket.create_server(("127.0.0.1", 0))
    requests = []

    def answer() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                requests.append(connection.recv(65536))
                connection.sendall(b"NOT HTTP AT ALL\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    try:
        outcome = deliver([ALERTS[0], ALERTS[2]], Destination("soc", url, "high"), max_attempts=2,
                          sleep=lambda s: None)
    finally:
        listener.close()
    assert outcome.delivered == []
    assert [key for key, _ in outcome.dead] == ["a0", "a2"]
    assert all("BadStatusLine" in error for _, error in outcome.dead), outcome.dead
    assert len(requests) == 4


def test_destinations_are_checked():
    with pytest.raises(ValueError, match="min_severity 'urgent'"):
        Destination("soc", "http://x", "urgent")
    with pytest.raises(ValueError, match="is not http"):
        Destination("soc", "ftp://x")


def test_notify_delivers_pending_alerts_once_records_them_and_skips_suppressed(spark, tmp_path, receiver):
    from datetime import date, datetime

    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.notify.outbox import NOTIFICATIONS_TABLE, notify, pending

    lake = Lake(Home.resolve(tmp_path).create())
    lake.ensure(spark, "alerts")
    schema = lake.spec("alerts").schema
    rows = [{**{f: None for f in schema.fieldNames()}, "alert_id": f"a{n}", "severity": sev, "rule_name": "r",
             "src_ip": "10.0.0.5", "evidence": "e", "detected_at": datetime(2026, 11, 20, 10, n),
             "event_date": date(2026, 11, 20), "suppressed_by": by}
            for n, (sev, by) in enumerate([("high", None), ("critical", "s1"), ("low", None), ("critical", None)])]
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(lake.path("alerts")))
    soc = Destination("soc", receiver.url, "high")
    assert [a["alert_id"] for a in pending(spark, lake, soc)] == ["a0", "a3"]  # a1 suppressed, a2 too low
    first = notify(spark, lake, soc, sleep=lambda s: None)
    assert first.delivered == ["a0", "a3"]
    assert sorted((r.alert_id, r.status) for r in lake.read(spark, NOTIFICATIONS_TABLE).collect()) == [
        ("a0", "delivered"), ("a3", "delivered")]
    # The next pass (a restart) finds nothing pending: nothing is sent twice.
    assert notify(spark, lake, soc, sleep=lambda s: None).delivered == []
    assert [key for key, _, _ in receiver.received] == ["a0", "a3"]


def test_a_finding_delivered_under_an_earlier_rule_version_is_not_sent_again(spark, tmp_path, receiver):
    # A new version's backfill raises the finding again under another alert_id: it was posted again.
    from datetime import date, datetime

    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.notify.outbox import notify, pending

    lake = Lake(Home.resolve(tmp_path).create())
    lake.ensure(spark, "alerts")
    schema = lake.spec("alerts").schema
    start = datetime(2026, 11, 20, 10)

    def alert(alert_id: str, version: int, ip: str) -> dict:
        return {**{f: None for f in schema.fieldNames()}, "alert_id": alert_id, "rule_id": "r1",
                "rule_version": version, "severity": "high", "rule_name": "r", "src_ip": ip, "mac": None,
                "device": None, "evidence": "e",
                "window_start": start, "window_end": start, "detected_at": start, "event_date": date(2026, 11, 20)}

    def add(*rows: dict) -> None:
        spark.createDataFrame(list(rows), schema).write.format("delta").mode("append").save(str(lake.path("alerts")))

    add(alert("v1", 1, "10.0.0.5"), alert("v1-other", 1, "10.0.0.5"))
    soc = Destination("soc", receiver.url, "high")
    assert notify(spark, lake, soc, sleep=lambda s: None).delivered == ["v1", "v1-other"]
    add(alert("v2", 2, "10.0.0.5"), alert("v2-new-host", 2, "10.0.0.6"))
    assert [a["alert_id"] for a in pending(spark, lake, soc)] == ["v2-new-host"]


@pytest.mark.parametrize("receiver", [[503, 503]], indirect=True)
def test_dead_lettered_alerts_are_sent_again_only_when_asked_and_then_once(spark, tmp_path, receiver):
    from datetime import date, datetime

    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.notify.outbox import NOTIFICATIONS_TABLE, notify, pending

    lake = Lake(Home.resolve(tmp_path).create())
    lake.ensure(spark, "alerts")
    schema = lake.spec("alerts").schema
    rows = [{**{f: None for f in schema.fieldNames()}, "alert_id": "d0", "severity": "high", "rule_name": "r",
             "src_ip": "10.0.0.5", "evidence": "e", "detected_at": datetime(2026, 11, 20, 10, 0),
             "event_date": date(2026, 11, 20)}]
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(lake.path("alerts")))
    soc = Destination("soc", receiver.url, "high")
    assert notify(spark, lake, soc, max_attempts=2, sleep=lambda s: None).dead == [("d0", "HTTP 503")]
    assert pending(spark, lake, soc) == []  # a plain pass leaves the dead letter alone
    assert [a["alert_id"] for a in pending(spark, lake, soc, retry_dead=True)] == ["d0"]
    assert notify(spark, lake, soc, retry_dead=True, sleep=lambda s: None).delivered == ["d0"]
    assert notify(spark, lake, soc, retry_dead=True, sleep=lambda s: None).delivered == []  # delivered: done
    assert [(key, status) for key, _, status in receiver.received] == [("d0", 503), ("d0", 503), ("d0", 200)]
    assert sorted((r.alert_id, r.status) for r in lake.read(spark, NOTIFICATIONS_TABLE).collect()) == [
        ("d0", "dead"), ("d0", "delivered")]


def test_notify_without_a_destination_says_what_to_set(tmp_path, capsys):
    from pipelines.cli import main

    assert main(["notify", "--home", str(tmp_path)]) == 2
    assert "set notify_webhook_url" in capsys.readouterr().err


def test_a_notifier_killed_mid_delivery_delivers_everything_after_a_restart_under_the_same_keys(
        spark, tmp_path, receiver):
    from datetime import date, datetime

    from pipelines.home import Home
    from pipelines.lake.registry import Lake
    from pipelines.notify.outbox import NOTIFICATIONS_TABLE

    lake = Lake(Home.resolve(tmp_path).create())
    lake.ensure(spark, "alerts")
    schema = lake.spec("alerts").schema
    rows = [{**{f: None for f in schema.fieldNames()}, "alert_id": f"k{n}", "severity": "high", "rule_name": "r",
             "src_ip": "10.0.0.5", "evidence": "e", "detected_at": datetime(2026, 11, 20, 10, n),
             "event_date": date(2026, 11, 20)} for n in range(3)]
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(lake.path("alerts")))
    command = [sys.executable, "-m", "pipelines.cli", "notify", "--home", str(tmp_path),
               "--set", f"notify_webhook_url={receiver.url}"]
    receiver.hold.set()  # k0 is answered; k1 waits, and the notifier is killed while it waits
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(receiver.arrived) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert receiver.arrived == ["k0", "k1"]  # k1's request is in flight, held by the receiver
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert [key for key, _, _ in receiver.received] == ["k0"]
    receiver.hold.clear()
    assert not lake.exists(NOTIFICATIONS_TABLE)  # killed before recording anything

    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    keys = [key for key, _, _ in receiver.received]
    # At least once: k0 is delivered again after the restart, under the same key, so a receiver
    # that remembers keys drops it; k1 (killed in flight) was answered after the kill, and is sent again.
    assert keys.count("k0") == 2 and keys.count("k1") == 2 and "k2" in keys
    recorded = sorted((r.alert_id, r.status) for r in lake.read(spark, NOTIFICATIONS_TABLE).collect())
    assert recorded == [("k0", "delivered"), ("k1", "delivered"), ("k2", "delivered")]
