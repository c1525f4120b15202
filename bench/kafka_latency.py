"""Kafka: the real-time alert path's latency and the ETL's throughput from Kafka, beside plain Spark.

What runs, one phase at a time (nothing else shares the 2 cores within a phase):

1. Set-up: the development broker on a free port; a home processed by `seclake run-once` over a
   generated hour (so `dhcp_leases` and the device inventory attribute the probes).
2. Throughput: `--hours` x `--hosts` of generated logs are shipped to their topics first
   (zeek.<kind>, suricata.eve, through `seclake ship`'s shipper), then `seclake run-once --only
   etl_kafka` on a fresh home reads them into bronze, quarantine and silver; `events_per_s` =
   data lines / the stage's wall time (query start included, as a run-once pays it). Baseline in
   the same run: plain Spark reading the same topics (`readStream.format("kafka")`, AvailableNow)
   and writing the values as Parquet (`plain_events_per_s`); `etl_kafka_ratio` = ours / plain.
3. Real-time path: `seclake realtime` (Spark's real-time mode, suricata.eve -> seclake.alerts).
   For `--duration` seconds this process produces background EVE flow records (`--rate` per
   second) and, every 100 ms, a probe: a priority-1 alert from an address whose newest lease
   names an inventory device, each with its own signature id (so its own alert id). Latency per
   probe: the alert message's Kafka timestamp minus the probe's (both CreateTime, set by the
   producing client when it sends; one machine, one clock). `realtime_p50_ms`, `realtime_p95_ms`,
   measured after a warm-up: probes every 200 ms until the first alert message comes back (the
   query's long-running tasks start a few seconds after its first offsets are fixed); that wait
   is `realtime_first_alert_s`.

Not measured here: `microbatch_p95_s` (produced event -> its alert row in the Delta `alerts`
table). The micro-batch path's alert waits for the DHCP lease piece holding the event to close
and pass the lease watermark (minutes of event time: docs/attribution.md), so a short live feed
at wall-clock time raises no alert in the run; its latency is `bench/alert_latency.py`'s
per-event figure for the file path (issue "alerts within seconds"). The key is `nan`.

    python bench/kafka_latency.py --quick      # 15 s of probes, 3 generated hours (not re-timed; 20 s and
                                               # 4 hours took 310 s)
    python bench/kafka_latency.py              # 60 s of probes, 400k events
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from pipelines.home import Home  # noqa: E402
from pipelines.kafka.broker import Broker  # noqa: E402
from pipelines.servers import free_port  # noqa: E402


def seclake(*args: str, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    done = subprocess.run([common.PYTHON, "-m", "pipelines.cli", *args], cwd=common.REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"seclake {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def eve(ts: datetime, src_ip: str, kind: str, sid: int = 0) -> bytes:
    record: dict = {"timestamp": ts.strftime("%Y-%m-%dT%H:%M:%S.%f") + "+0000", "event_type": kind,
                    "src_ip": src_ip, "src_port": 50000, "dest_ip": "198.51.100.7", "dest_port": 443,
                    "proto": "TCP", "host": "ids-bench"}
    if kind == "alert":
        record["alert"] = {"action": "allowed", "gid": 1, "signature_id": sid, "rev": 1,
                           "signature": f"bench probe {sid}", "category": "Bench", "severity": 1}
    else:
        record["flow"] = {"pkts_toserver": 3, "pkts_toclient": 2, "bytes_toserver": 300, "bytes_toclient": 200}
    return json.dumps(record, separators=(",", ":")).encode()


def held_addresses(home: Home) -> list[str]:
    """Addresses whose newest lease piece names an inventory device: the probes' sources."""
    from deltalake import DeltaTable

    leases = DeltaTable(str(home.table("dhcp_leases"))).to_pyarrow_table(columns=["ip", "mac", "valid_from"])
    newest: dict[str, tuple] = {}
    for ip, mac, start in zip(*(leases.column(c).to_pylist() for c in ("ip", "mac", "valid_from"))):
        if ip not in newest or start > newest[ip][1]:
            newest[ip] = (mac, start)
    devices = {line.split(",")[0] for line in (home.reference / "devices.csv").read_text().splitlines()[1:]}
    return sorted(ip for ip, (mac, _) in newest.items() if mac in devices)


def realtime_phase(home: Home, bootstrap: str, env: dict[str, str], duration: float,
                   rate: int) -> tuple[list[float], float]:
    """Probe -> alert latencies (ms) of `seclake realtime` under a background feed, and the seconds
    from its first offsets to its first alert message (warm-up)."""
    from confluent_kafka import Consumer, Producer

    addresses = held_addresses(home)
    if not addresses:
        raise SystemExit("no address of the set-up home is leased to an inventory device")
    log = home.root / "realtime.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([common.PYTHON, "-m", "pipelines.cli", "realtime", "--home", str(home.root),
                                 "--kafka", bootstrap], cwd=common.REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        offsets = home.checkpoints / "realtime_alerts" / "offsets" / "0"
        deadline = time.monotonic() + 300
        while not offsets.is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"seclake realtime did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        sent: dict[str, float] = {}

        def delivered(err, msg) -> None:
            if err is None and msg.key():
                sent[msg.key().decode()] = msg.timestamp()[1]

        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.time()}",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["seclake.alerts"])
        received: dict[str, float] = {}
        stop = threading.Event()

        def consume() -> None:
            # A probe is known by its event time (ms, as the alert message carries it): one every 100 ms.
            while not stop.is_set():
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    received.setdefault(json.loads(msg.value())["event_time"], msg.timestamp()[1])

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        n = 0

        def probe() -> None:
            nonlocal n
            n += 1
            ts = datetime.now(timezone.utc)
            key = ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"
            producer.produce("suricata.eve", eve(ts, addresses[n % len(addresses)], "alert", 8_000_000 + n),
                             key=key.encode(), on_delivery=delivered)

        # Warm-up: the query's tasks start after its first offsets are fixed; probes sent before
        # wait for them. Measured apart (`realtime_first_alert_s`), then the steady state.
        warm = time.monotonic()
        while not received and time.monotonic() - warm < 120:
            probe()
            producer.flush(5)
            time.sleep(0.2)
        first_alert_s = time.monotonic() - warm
        if not received:
            raise SystemExit(f"no alert message within 120 s:\n{log.read_text(errors='replace')[-3000:]}")
        sent.clear()
        received.clear()  # a warm-up alert arriving later has no probe in `sent`: not counted
        started = time.monotonic()
        background_every = 1.0 / rate if rate else None
        next_probe = next_background = started
        while time.monotonic() - started < duration:
            now = time.monotonic()
            if now >= next_probe:
                probe()
                next_probe += 0.1
            if background_every and now >= next_background:
                producer.produce("suricata.eve", eve(datetime.now(timezone.utc), addresses[0], "flow"))
                next_background += background_every
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(30)
        deadline = time.monotonic() + 30
        while any(k not in received for k in sent) and time.monotonic() < deadline:
            time.sleep(0.5)
        stop.set()
        reader.join()
        consumer.close()
        missing = sum(1 for k in sent if k not in received)
        if missing:
            print(f"realtime: {missing} of {len(sent)} probes raised no alert message within 30 s")
        return [received[s] - sent[s] for s in received if s in sent], first_alert_s
    finally:
        common.stop_gracefully(proc, 60)


def ship_generated(gen: Path, manifest: dict, bootstrap: str, folder: Path) -> int:
    """The generator's files to their topics through `seclake ship`'s shipper (Zeek headers in the
    message headers, as in production); the lines produced."""
    from pipelines.kafka.ship import Shipper
    from sample_data.generator import append_as_current

    folders = {append_as_current(gen, f, folder) for f in manifest["files"]}
    shipped = 0
    for f in sorted(folders):
        shipper = Shipper(f, bootstrap)
        shipper.step()
        shipper.flush()
        shipped += shipper.shipped
    return shipped


def etl_phase(work: Path, gen: Path, bootstrap: str, env: dict[str, str]) -> tuple[int, float]:
    """`seclake run-once --only etl_kafka` over the topics: (data lines, seconds of the stage)."""
    home = Home(work / "etl-home").create()
    shutil.copytree(gen / "reference", home.reference, dirs_exist_ok=True)
    done = seclake("run-once", "--json", "--home", str(home.root), "--only", "etl_kafka", env=env)
    for line in done.stdout.splitlines():
        report = common.stage_report(line)
        if report and report["name"] == "etl_kafka":
            return report["read"]["messages"], report["duration_s"]
    raise SystemExit(f"no etl_kafka report in the run-once output:\n{done.stdout[-2000:]}")


def plain_phase(work: Path, bootstrap: str) -> tuple[int, float]:
    """Plain Spark over the same topics: Kafka -> the value as a string -> Parquet, AvailableNow."""
    spark = common.spark_session()
    started = time.monotonic()
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribePattern", "(zeek|suricata)[.].+").option("startingOffsets", "earliest").load()
             .selectExpr("topic", "CAST(value AS STRING) AS line")
             .writeStream.format("parquet").option("path", str(work / "plain"))
             .option("checkpointLocation", str(work / "plain-checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.monotonic() - started
    rows = spark.read.parquet(str(work / "plain")).count()
    spark.stop()
    return rows, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="15 s of probes, 3 generated hours (sized for < 5 min)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of probes (default 60)")
    parser.add_argument("--rate", type=int, default=200, help="background EVE records per second (default 200)")
    parser.add_argument("--hours", type=float, default=8, help="generated hours produced for the throughput phase")
    parser.add_argument("--hosts", type=int, default=150, help="generated hosts for the throughput phase")
    parser.add_argument("--work", default=None, help="scratch folder (default $TMPDIR/seclake-bench-kafka_latency)")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.hours = 15.0, 3
    work = common.work_dir("kafka_latency", args.work)
    broker = Broker(Home(work / "broker").create(), free_port()).start()
    try:
        env = {**os.environ, "SECLAKE_KAFKA": broker.bootstrap}
        without = {k: v for k, v in env.items() if k != "SECLAKE_KAFKA"}
        print("set-up: a generated hour through seclake run-once (leases and devices for the probes)", flush=True)
        small = work / "small"
        common.generate(small, hours=1, hosts=12, seed=3)
        home = Home(work / "home").create()
        shutil.copytree(small / "reference", home.reference, dirs_exist_ok=True)
        shutil.copytree(small / "landing", home.landing, dirs_exist_ok=True)
        seclake("run-once", "--home", str(home.root), env=without)

        # Throughput first: the shipper resumes from its topics' last messages, which must be its own.
        print(f"throughput: {args.hours:g} generated hours of {args.hosts} hosts to Kafka, then etl_kafka and "
              "plain Spark over them", flush=True)
        gen = work / "gen"
        manifest = common.generate(gen, hours=args.hours, hosts=args.hosts, seed=7)
        shipped = ship_generated(gen, manifest, broker.bootstrap, work / "sensors")
        lines, seconds = etl_phase(work, gen, broker.bootstrap, env)
        plain_rows, plain_seconds = plain_phase(work, broker.bootstrap)

        print(f"real-time path: {args.duration:.0f} s of probes (10/s) over {args.rate} background records/s",
              flush=True)
        latencies, first_alert_s = realtime_phase(home, broker.bootstrap, env, args.duration, args.rate)
    finally:
        broker.stop()
    p50, p95 = common.percentile(latencies, 50), common.percentile(latencies, 95)
    ours, plain = lines / seconds, plain_rows / plain_seconds
    common.print_table(["measure", "value"], [
        ["real-time warm-up (s)", f"{first_alert_s:.1f}"], ["probes with an alert", len(latencies)],
        ["real-time p50 (ms)", f"{p50:.0f}"], ["real-time p95 (ms)", f"{p95:.0f}"],
        ["real-time max (ms)", f"{max(latencies, default=float('nan')):.0f}"],
        ["lines shipped", shipped], ["etl_kafka data lines", lines], ["etl_kafka seconds", f"{seconds:.1f}"],
        ["etl_kafka events/s", f"{ours:,.0f}"], ["plain Spark events/s", f"{plain:,.0f}"],
    ], title="Kafka: real-time alerts and ETL throughput")
    common.save_results("kafka_latency", {"args": vars(args), "realtime_ms": latencies,
                                          "realtime_first_alert_s": first_alert_s, "etl_lines": lines,
                                          "etl_seconds": seconds, "plain_rows": plain_rows,
                                          "plain_seconds": plain_seconds})
    shutil.rmtree(work, ignore_errors=True)
    print("microbatch_p95_s: nan: the micro-batch path's alert waits for the event's DHCP lease piece to close "
          "(minutes of event time), so this short live feed raises none; see bench/alert_latency.py")
    print(f"RESULT realtime_p50_ms={p50:.0f} realtime_p95_ms={p95:.0f} microbatch_p95_s=nan "
          f"events_per_s={ours:.0f} plain_events_per_s={plain:.0f} etl_kafka_ratio={ours / plain:.2f} "
          f"realtime_first_alert_s={first_alert_s:.1f}")


if __name__ == "__main__":
    main()
