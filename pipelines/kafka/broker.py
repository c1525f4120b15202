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
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipelines.home import Home
from pipelines.servers import ServerError, free_port, last_line, launch, recorded_port, running_pid, terminate

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


def cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes in URL-safe base64 that never starts with "-".

    An id starting with "-" reads as an option to kafka-storage's argument parser (1 format in 64
    failed so in CI); Kafka's own `Uuid.randomUuid` skips those ids for the same reason.

    >>> ident = cluster_id()
    >>> len(ident), ident.startswith("-")
    (22, False)
    """
    while True:
        ident = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not ident.startswith("-"):
            return ident


class BrokerError(ServerError):
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
        return running_pid(self.pid_file)

    def running(self) -> Broker:
        """This home's broker on the port it was started with (`server.properties`) when it runs,
        whatever port this one names; else this one.

        >>> Broker(Home.resolve("/nonexistent"), 19092).running().port
        19092
        """
        port = recorded_port(self.folder / "server.properties", "advertised.listeners")
        return self if self.pid() is None or port is None else Broker(self.home, port)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Broker:
        """Start the broker (formatting its storage on first use) and wait until it accepts
        connections; a broker already running for this home is left as it is."""
        if self.pid() is not None:
            return self
        jars = sorted(KAFKA_JARS.glob("*.jar"))
        if not any(j.name.startswith("kafka_2.13-") for j in jars):
            raise BrokerError(f"the Kafka jars are missing from {KAFKA_JARS}; run `bash .ci/setup` once "
                              "(it fetches them from Maven Central)")
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        classpath = os.pathsep.join(str(j) for j in jars)
        java = ["java", HEAP, f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}", "-cp", classpath]
        if not (self.folder / "data" / "meta.properties").is_file():
            done = subprocess.run([*java, "kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(config)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise BrokerError(f"formatting the Kafka storage in {self.folder / 'data'} failed: "
                                  f"{last_line(done.stderr or done.stdout)}")
        try:
            launch([*java, "kafka.Kafka", str(config)], name="Kafka broker", port=self.port, pid_file=self.pid_file,
                   output=self.folder / "stdout.log", log=self.log, timeout_s=timeout_s)
        except ServerError as exc:
            raise BrokerError(str(exc)) from None
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop the broker (SIGTERM: a controlled shutdown, then SIGKILL after `timeout_s`);
        False when none was running."""
        return terminate(self.pid_file, timeout_s)

    def _write_config(self) -> Path:
        (self.folder / "log4j2.properties").write_text(LOG4J2.format(log=self.log))
        config = self.folder / "server.properties"
        # The controller's port stays what the storage was formatted with.
        known = [line.split(":")[-1] for line in (config.read_text().splitlines() if config.is_file() else [])
                 if line.startswith("controller.quorum.voters=")]
        controller = int(known[0]) if known else free_port()
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
