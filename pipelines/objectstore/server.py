"""S3Proxy, an S3-compatible server over a local folder, for development, tests and demos of a lake
on object storage (`seclake s3 start|stop|status`).

S3Proxy's jars come from Maven Central (`.ci/s3proxy.pom.xml`, fetched by `.ci/setup` into
`.jars/s3proxy/`) and run in a JVM of their own. Everything lives in `<home>/s3/`: the buckets
(`data/<bucket>/`, plain files), `s3proxy.conf` with the access key and secret made on first
start, the log and `s3proxy.pid`. It listens on 127.0.0.1 only. Not for production: one process,
no replication; docs/deploy.md names real object stores.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from pipelines.home import Home
from pipelines.servers import ServerError, launch, recorded_port, running_pid, terminate

S3PROXY_JARS = Path(__file__).resolve().parents[2] / ".jars" / "s3proxy"
DEFAULT_PORT = 9000
START_TIMEOUT_S = 60.0
HEAP = "-Xmx256m"
# S3Proxy logs every request at DEBUG (millions of lines for one pipeline run): warnings only.
LOGBACK = """\
<configuration>
  <appender name="file" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d{{ISO8601}} %level [%logger{{20}}] %msg%n</pattern></encoder>
  </appender>
  <logger name="org.gaul.s3proxy.Main" level="INFO"/>
  <root level="WARN"><appender-ref ref="file"/></root>
</configuration>
"""


@dataclass(frozen=True)
class S3Server:
    """The development S3-compatible server of one home.

    >>> s = S3Server(Home.resolve("/tmp/h"), 9000)
    >>> s.endpoint, str(s.folder)
    ('http://127.0.0.1:9000', '/tmp/h/s3')
    """

    home: Home
    port: int = DEFAULT_PORT

    @property
    def folder(self) -> Path:
        return self.home.root / "s3"

    @property
    def endpoint(self) -> str:
        """`SECLAKE_S3_ENDPOINT` for clients of this server."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / "s3proxy.log"

    @property
    def pid_file(self) -> Path:
        return self.folder / "s3proxy.pid"

    def pid(self) -> int | None:
        """The running server's process id, or None."""
        return running_pid(self.pid_file)

    def running(self) -> S3Server:
        """This home's server on the port it was started with when it runs, whatever port this one
        names; else this one.

        >>> S3Server(Home.resolve("/nonexistent"), 9010).running().port
        9010
        """
        port = recorded_port(self.folder / "s3proxy.conf", "s3proxy.endpoint")
        return self if self.pid() is None or port is None else S3Server(self.home, port)

    def credentials(self) -> tuple[str, str]:
        """(access key, secret key), made on first use and kept in the config."""
        config = self.folder / "s3proxy.conf"
        if config.is_file():
            values = dict(line.split("=", 1) for line in config.read_text().splitlines() if "=" in line)
            return values["s3proxy.identity"], values["s3proxy.credential"]
        return "seclake", secrets.token_hex(16)

    def environment(self) -> dict[str, str]:
        """The variables that point seclake (and S3A, delta-rs, the AWS CLI) at this server."""
        key, secret = self.credentials()
        return {"SECLAKE_S3_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}

    def start(self, buckets: tuple[str, ...] = ("lake",), timeout_s: float = START_TIMEOUT_S) -> "S3Server":
        """Start the server (a running one is left as it is) with `buckets` present, and wait
        until it accepts connections."""
        if self.pid() is None:
            jars = sorted(S3PROXY_JARS.glob("*.jar"))
            if not any(j.name.startswith("s3proxy-") for j in jars):
                raise ServerError(f"the S3Proxy jars are missing from {S3PROXY_JARS}; run `bash .ci/setup` once "
                                  "(it fetches them from Maven Central)")
            config = self._write_config()
            launch(["java", HEAP, f"-Dlogback.configurationFile={self.folder / 'logback.xml'}",
                    "-cp", f"{S3PROXY_JARS}/*", "org.gaul.s3proxy.Main", "--properties", str(config)],
                   name="S3 server (S3Proxy)", port=self.port, pid_file=self.pid_file,
                   output=self.folder / "stdout.log", log=self.log, timeout_s=timeout_s)
        for bucket in buckets:
            # The filesystem store keeps a bucket as a folder of its data directory.
            (self.folder / "data" / bucket).mkdir(parents=True, exist_ok=True)
        return self

    def stop(self) -> bool:
        """Stop the server; False when none was running."""
        return terminate(self.pid_file, timeout_s=30)

    def _write_config(self) -> Path:
        key, secret = self.credentials()
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        (self.folder / "logback.xml").write_text(LOGBACK.format(log=self.log))
        config = self.folder / "s3proxy.conf"
        config.write_text("\n".join([
            f"s3proxy.endpoint=http://127.0.0.1:{self.port}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={key}",
            f"s3proxy.credential={secret}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.folder / 'data'}",
            f"jclouds.identity={key}",
            f"jclouds.credential={secret}",
            "",
        ]))
        return config
