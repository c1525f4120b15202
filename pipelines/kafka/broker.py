"""A single-node Apache Kafka broker (KRaft mode) for development, tests and the demo.

Apache Kafka's own jars from Maven Central (`.ci/kafka.pom.xml`, fetched by `.ci/setup` into
`.jars/kafka/`), run by `java` as one process that is both broker and controller. Everything
lives in `<home>/kafka/`: `server.properties`, the data (`data/`), the broker's log
(`server.log`) and `broker.pid`. It listens on 127.0.0.1 only. Not for production: one node,
replication factor 1 (docs/kafka.md says what a real cluster changes).
"""
from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipelines.home import Home

KAFKA_JARS = Path(__file__).resolve().parents[2] / ".jars" / "kafka"
DEFAULT_PORT = 9092
# A broker that is not up within this long is reported with the tail of its log.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
HEAP = "-Xmx512m"  # a development broker: its page cache, not its heap, holds the data

LOG4J2 = """\
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %p [%c{{1}}] %m%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


class BrokerError(RuntimeError):
    """The broker could not be started or stopped; the message says why in one line."""


@dataclass(frozen=True)
class Broker:
    """The development broker of one home.

    >>> b = Broker(Home.resolve("/tmp/h"), 9092)
    >>> b.bootstrap, str(b.folder)
    ('127.0.0.1:9092', '/tmp/h/kafka')
    """

    home: Home
    port: int = DEFAULT_PORT

    @property
    def folder(self) -> Path:
        return self.home.root / "kafka"

    @property
    def bootstrap(self) -> str:
        """What clients pass as `bootstrap.servers` (Spark: `kafka.bootstrap.servers`)."""
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    @property
    def pid_file(self) -> Path:
        return self.folder / "broker.pid"

    def pid(self) -> int | None:
        """The running broker's process id, or None (no pid file, or its process is gone)."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Broker:
        """Start the broker (formatting its storage on first use) and wait until it accepts
        connections; a broker already running for this home is left as it is."""
        if self.pid() is not None:
            return self
        jars = sorted(KAFKA_JARS.glob("*.jar"))
        if not any(j.name.startswith("kafka_2.13-") for j in jars):
            raise BrokerError(f"the Kafka jars are missing from {KAFKA_JARS}; run `bash .ci/setup` once "
                              "(it fetches them from Maven Central)")
        if _port_in_use(self.port):
            raise BrokerError(f"port {self.port} on 127.0.0.1 is taken by another program; "
                              "choose another (--port / kafka_port)")
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        classpath = os.pathsep.join(str(j) for j in jars)
        java = ["java", HEAP, f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}", "-cp", classpath]
        if not (self.folder / "data" / "meta.properties").is_file():
            cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            done = subprocess.run([*java, "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(config)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise BrokerError(f"formatting the Kafka storage in {self.folder / 'data'} failed: "
                                  f"{_last_line(done.stderr or done.stdout)}")
        with open(self.folder / "stdout.log", "ab") as out:
            proc = subprocess.Popen([*java, "kafka.Kafka", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout_s
        while not _port_in_use(self.port):
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise BrokerError(f"the Kafka broker exited with code {proc.returncode} while starting; "
                                  f"last log line: {_last_line(_tail(self.log))}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the Kafka broker did not accept connections within {timeout_s:.0f} s; "
                                  f"see {self.log}")
            time.sleep(0.2)
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop the broker (SIGTERM: a controlled shutdown, then SIGKILL after `timeout_s`);
        False when none was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def _write_config(self) -> Path:
        (self.folder / "log4j2.properties").write_text(LOG4J2.format(log=self.log))
        config = self.folder / "server.properties"
        # The controller's port stays what the storage was formatted with.
        known = [line.split(":")[-1] for line in (config.read_text().splitlines() if config.is_file() else [])
                 if line.startswith("controller.quorum.voters=")]
        controller = int(known[0]) if known else _free_port()
        config.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self.folder / 'data'}",
            "num.partitions=1",
            # One node: every internal topic has one replica.
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "",
        ]))
        return config


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A child of this process that exited is a zombie until reaped: reap it, then it is gone.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
