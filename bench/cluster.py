"""ETL throughput on a Spark standalone cluster and with the lake on S3, against local[2] on local disk.

One run, one configuration at a time on the same generated landing files, each in a fresh
process (the master differs), each the real ETL query (`run_once(only=["etl"])`, several
micro-batches of `--files-per-batch` files per sensor folder):

- local disk: `local[2]`, the lake in the home folder (the baseline);
- local S3: `local[2]`, the lake on the development S3 server (S3Proxy on localhost): the cost of
  object storage alone. Its S3 requests are counted by S3A in the one JVM (driver and tasks)
  and divided by the micro-batches;
- cluster S3: a standalone master and two workers of one core each (`LocalCluster`), the lake
  on the same server: what the cluster's scheduling and executor processes cost on this box.

Both Spark sides get the machine's 2 cores; the S3 server runs beside them in every S3 side.

RESULT keys: `cluster_over_local2` = cluster events/s / local[2] events/s (both with the lake
on S3, higher is better); `s3_over_local_disk` = local[2] on S3 / local[2] on local disk;
`s3_requests_per_batch` (S3A requests per ETL micro-batch); `batch_s_s3`, `batch_s_local`
(seconds per micro-batch).

    python bench/cluster.py --quick      # 1 h of 20 hosts (~4 min on 2 cores)
    python bench/cluster.py              # 2 h of 50 hosts
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

# S3A's IOStatistics counters that are requests to the store.
REQUEST_COUNTERS = ("object_list_request", "object_continue_list_request", "object_metadata_request",
                    "object_put_request", "object_delete_request", "object_copy_requests",
                    "multipart_upload_started", "object_multipart_initiated", "action_http_get_request",
                    "action_http_head_request", "object_bulk_delete_request")


def child(home: str, files_per_batch: int) -> None:
    """Run the ETL once on `home` in this process (master and lake from the environment); print JSON."""
    from pipelines.home import Home
    from pipelines.jobs import run_once
    from pipelines.lake.registry import Lake
    from pipelines.settings import Settings
    from pipelines.spark import get_spark

    spark = get_spark(app_name="seclake-bench-cluster", ui=False)
    lake = Lake(Home.resolve(home).create())
    started = time.monotonic()
    report = run_once(spark, lake, Settings(max_files_per_trigger=files_per_batch), only=["etl"])[0]
    seconds = time.monotonic() - started
    requests = None
    if lake.home.lake is not None:
        jvm = spark.sparkContext._jvm
        fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(str(lake.home.lake)),
                                                    spark.sparkContext._jsc.hadoopConfiguration())
        counters = dict(fs.getIOStatistics().counters())
        requests = sum(int(counters.get(name, 0)) for name in REQUEST_COUNTERS)
    rows = sum(n for table, n in report.rows_out.items() if table.startswith("bronze_"))
    print(json.dumps({"error": report.error, "batches": report.batches, "lines": rows, "seconds": seconds,
                      "requests": requests}))


def run_side(name: str, home: Path, env: dict[str, str], files_per_batch: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", str(home), "--files-per-batch", str(files_per_batch)],
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{name}: the ETL run failed: {done.stderr.strip().splitlines()[-1:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["error"]:
        raise SystemExit(f"{name}: {result['error']}")
    result["events_per_s"] = result["lines"] / result["seconds"]
    requests = f", {result['requests']:,} S3 requests" if result["requests"] else ""
    print(f"{name}: {result['batches']} batches, {result['lines']:,} lines in {result['seconds']:.1f} s "
          f"({result['events_per_s']:,.0f}/s){requests}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 h of 20 hosts")
    parser.add_argument("--hours", type=float, default=2)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--files-per-batch", type=int, default=2, help="maxFilesPerTrigger (default 2)")
    parser.add_argument("--work", help="scratch folder (default $TMPDIR/seclake-bench-cluster)")
    parser.add_argument("--child", metavar="HOME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.files_per_batch)
        return
    if args.quick:
        args.hours, args.hosts = 1, 20
    from pipelines.cluster import LocalCluster
    from pipelines.home import Home
    from pipelines.objectstore.server import S3Server
    from pipelines.servers import free_port

    work = common.work_dir("cluster", args.work)
    gen = work / "input"
    manifest = common.generate(gen, hours=args.hours, hosts=args.hosts, seed=7)
    print(f"input: {sum(f['lines'] for f in manifest['files']):,} lines in {len(manifest['files'])} files "
          f"({args.hours} h, {args.hosts} hosts)", flush=True)
    server = S3Server(Home(work / "s3"), free_port()).start()
    cluster = LocalCluster(Home(work / "spark"), port=free_port(), workers=2, cores=1, memory="3g")
    results = {}
    try:
        base = {k: v for k, v in os.environ.items() if k not in ("SECLAKE_LAKE", "SECLAKE_SPARK_MASTER")}
        s3 = {**base, **server.environment()}
        sides = {
            "local disk": {**base, "SECLAKE_SPARK_MASTER": "local[2]"},
            "local S3": {**s3, "SECLAKE_SPARK_MASTER": "local[2]", "SECLAKE_LAKE": "s3a://lake/local2"},
            "cluster S3": {**s3, "SECLAKE_SPARK_MASTER": cluster.master_url, "SECLAKE_LAKE": "s3a://lake/cluster"},
        }
        for name, env in sides.items():
            home = Home(work / name.replace(" ", "-"))
            common.link_tree(gen / "landing", home.root / "landing")
            common.link_tree(gen / "reference", home.root / "reference")
            if name.startswith("cluster"):
                cluster.start()
            results[name] = run_side(name, home.root, env, args.files_per_batch)
            if name.startswith("cluster"):
                cluster.stop()
    finally:
        cluster.stop()
        server.stop()
    local, on_s3, on_cluster = results["local disk"], results["local S3"], results["cluster S3"]
    figures = {
        "cluster_over_local2": on_cluster["events_per_s"] / on_s3["events_per_s"],
        "s3_over_local_disk": on_s3["events_per_s"] / local["events_per_s"],
        "s3_requests_per_batch": on_s3["requests"] / max(on_s3["batches"], 1),
        "batch_s_s3": on_s3["seconds"] / max(on_s3["batches"], 1),
        "batch_s_local": local["seconds"] / max(local["batches"], 1),
    }
    common.print_table(["side", "batches", "lines", "seconds", "events/s", "S3 requests"],
                       [[n, r["batches"], r["lines"], round(r["seconds"], 1), round(r["events_per_s"]),
                         r["requests"] if r["requests"] is not None else "-"] for n, r in results.items()])
    common.save_results("cluster", {"args": vars(args), "results": results, "figures": figures,
                                    "load": os.getloadavg()})
    print("RESULT " + " ".join(f"{k}={v:.2f}" if k != "s3_requests_per_batch" else f"{k}={v:.0f}"
                               for k, v in figures.items()))


if __name__ == "__main__":
    main()
