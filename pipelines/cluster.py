"""A Spark standalone cluster on this machine (a master and N workers) for development, tests and
the cluster benchmark: `seclake cluster start|stop|status`, then `SECLAKE_SPARK_MASTER=spark://...`.

Each daemon is pyspark's own `bin/spark-class` running Spark's Master or Worker class, a process of
its own with a pid file and a log under `<home>/cluster/`, on 127.0.0.1 only. A real cluster runs the
same daemons on many machines (docs/deploy.md).
"""
from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from pipelines.home import Home
from pipelines.servers import ServerError, free_port, launch, recorded_port, running_pid, terminate

DEFAULT_PORT = 7077
START_TIMEOUT_S = 120.0
# A finished application's work folder (its jars and executor logs) is kept an hour for its logs: at
# the schedule's four runs an hour that is about 100 MB per worker, not 2 GB a day.
WORKER_APP_TTL_S = 3600


def spark_class() -> Path:
    """pyspark's `bin/spark-class`, which starts a Spark daemon with pyspark's jars."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@dataclass(frozen=True)
class LocalCluster:
    """A standalone master on `port` and `workers` workers of `cores` cores and `memory` each.

    >>> c = LocalCluster(Home.resolve("/tmp/h"), port=7077)
    >>> c.master_url, str(c.folder)
    ('spark://127.0.0.1:7077', '/tmp/h/cluster')
    """

    home: Home
    port: int = DEFAULT_PORT
    workers: int = 2
    cores: int = 1
    memory: str = "3g"

    @property
    def folder(self) -> Path:
        return self.home.root / "cluster"

    @property
    def master_url(self) -> str:
        """`SECLAKE_SPARK_MASTER` for applications on this cluster."""
        return f"spark://127.0.0.1:{self.port}"

    def running(self) -> LocalCluster:
        """This home's cluster on the port its master was started with when it runs, whatever port
        this one names; else this one.

        >>> LocalCluster(Home.resolve("/nonexistent"), port=7078).running().port
        7078
        """
        port = recorded_port(self.folder / "master.conf", "master")
        return self if running_pid(self.folder / "master.pid") is None or port is None else replace(self, port=port)

    def _pid_files(self) -> list[Path]:
        """The master's pid file, then the workers': this cluster's, and any a start with more workers left
        (`cluster stop` does not know how many `cluster start --workers N` started).

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     c = LocalCluster(Home.resolve(tmp))
        ...     c.folder.mkdir()
        ...     _ = (c.folder / "worker-4.pid").write_text("4242")
        ...     [p.name for p in c._pid_files()]
        ['master.pid', 'worker-1.pid', 'worker-2.pid', 'worker-4.pid']
        """
        workers = {self.folder / f"worker-{i}.pid" for i in range(1, self.workers + 1)}
        return [self.folder / "master.pid", *sorted(workers | set(self.folder.glob("worker-*.pid")))]

    def pids(self) -> list[int]:
        """The running daemons' process ids (master first)."""
        return [pid for pid in (running_pid(p) for p in self._pid_files()) if pid is not None]

    @property
    def ui_url(self) -> str | None:
        """The master's web UI (applications, workers), on a free port chosen at its start."""
        port = self.ui_port()
        return f"http://127.0.0.1:{port}" if port is not None else None

    def ui_port(self) -> int | None:
        try:
            return int((self.folder / "master.ui").read_text())
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        """Workers the master counts as alive (from its web UI's JSON), 0 when it does not answer."""
        port = self.ui_port()
        if port is None:
            return 0
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=2) as answer:
                return int(json.load(answer).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "LocalCluster":
        """Start the master and the workers (those running are left as they are) and wait until
        every worker has registered."""
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SPARK_LOG_DIR": str(self.folder), "SPARK_NO_DAEMONIZE": "1",
               # The web UIs bind every interface without it (and the master's has kill buttons).
               "SPARK_LOCAL_IP": "127.0.0.1",
               # Each application copies its jars (the Delta jars, 23 MB) into every worker's work folder:
               # finished applications' folders go after WORKER_APP_TTL_S instead of piling up.
               "SPARK_WORKER_OPTS": f"-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=600 "
                                    f"-Dspark.worker.cleanup.appDataTtl={WORKER_APP_TTL_S}"}
        master_pid = self.folder / "master.pid"
        if running_pid(master_pid) is None:
            ui = free_port()
            (self.folder / "master.ui").write_text(str(ui))
            (self.folder / "master.conf").write_text(f"master={self.master_url}\n")
            launch([str(spark_class()), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(ui)],
                   name="Spark master", port=self.port, pid_file=master_pid, output=self.folder / "master.log",
                   log=self.folder / "master.log", timeout_s=timeout_s, env=env)
        for i in range(1, self.workers + 1):
            pid_file = self.folder / f"worker-{i}.pid"
            if running_pid(pid_file) is not None:
                continue
            port = free_port()
            work = self.folder / f"worker-{i}"
            launch([str(spark_class()), "org.apache.spark.deploy.worker.Worker", self.master_url,
                    "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port()),
                    "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work)],
                   name=f"Spark worker {i}", port=port, pid_file=pid_file, output=self.folder / f"worker-{i}.log",
                   log=self.folder / f"worker-{i}.log", timeout_s=timeout_s, env=env)
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            if time.monotonic() > deadline:
                raise ServerError(f"{self.alive_workers()} of {self.workers} Spark workers registered with "
                                  f"{self.master_url} within {timeout_s:.0f} s; see {self.folder}/worker-*.log")
            time.sleep(0.5)
        return self

    def stop(self) -> bool:
        """Stop the workers, then the master; False when nothing was running."""
        stopped = [terminate(p, timeout_s=30) for p in reversed(self._pid_files())]
        return any(stopped)
