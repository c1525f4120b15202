"""`seclake serve`: Spark's Thrift JDBC/ODBC server over one home's tables, read-only, for BI tools.

The server is Spark's own (`HiveThriftServer2`, which pyspark ships with the Hive JDBC driver and
beeline), started in this process's session. Statements from JDBC clients reach Spark's parser
without passing through Python, so the sandbox is a Spark session extension in the JVM
(`jvm/sandbox/`, compiled by `.ci/setup` into `.jars/seclake-sandbox.jar`) that refuses what
`pipelines.sandbox` refuses. Each JDBC connection gets a new Spark session, which the extension
guards; the server's own session (which registers the tables) is the one it trusts.
Connecting DBeaver or Superset, and what is refused: docs/bi.md.
"""
from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import TextIO

from pipelines.sandbox import ESCAPE_FUNCTIONS

SANDBOX_JAR = "seclake-sandbox.jar"  # in pipelines.spark.JARS_DIR, with the Delta jars
SANDBOX_EXTENSION = "seclake.sandbox.SqlSandbox"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 10000
# Tables the pipeline creates after the server started, and columns it adds, are named within this many seconds.
REGISTER_SECONDS = 10.0


def server_conf(host: str, port: int) -> dict[str, str]:
    """The Spark settings of a served session: the sandbox extension after Delta's, and where to listen.

    >>> conf = server_conf("127.0.0.1", 10001)
    >>> conf["spark.sql.extensions"], conf["spark.hadoop.hive.server2.thrift.port"]
    ('io.delta.sql.DeltaSparkSessionExtension,seclake.sandbox.SqlSandbox', '10001')
    >>> conf["spark.sql.thriftServer.incrementalCollect"]
    'true'
    """
    from pipelines.spark import BASE_CONF, delta_jars  # pyspark: imported when needed (`seclake tables` is quick)

    if not host.strip():
        raise ValueError("--host must name an interface, e.g. 127.0.0.1")
    return {
        "spark.sql.extensions": f"{BASE_CONF['spark.sql.extensions']},{SANDBOX_EXTENSION}",
        # Static (a JDBC client cannot change it): the extension refuses these functions.
        "spark.seclake.sandbox.escapeFunctions": ",".join(sorted(ESCAPE_FUNCTIONS)),
        # The server's threads load classes with the JVM's own class loader, which does not see
        # spark.jars: without this, opening a JDBC session fails on the Delta catalog's class.
        "spark.driver.extraClassPath": ":".join(str(p) for p in delta_jars()),
        "spark.hadoop.hive.server2.thrift.bind.host": host,
        "spark.hadoop.hive.server2.thrift.port": str(port),
        "spark.hadoop.hive.server2.transport.mode": "binary",
        # One Spark session per connection: what one client sets never reaches another's.
        "spark.sql.hive.thriftServer.singleSession": "false",
        # A result goes to the client a partition at a time: collected whole (Spark's default), a BI
        # tool's preview of `SELECT * FROM silver_conn` would fill the driver every client shares.
        "spark.sql.thriftServer.incrementalCollect": "true",
    }


def jdbc_url(host: str, port: int) -> str:
    """The URL a JDBC client (beeline, DBeaver) connects to.

    >>> jdbc_url("127.0.0.1", 10000)
    'jdbc:hive2://127.0.0.1:10000/default'
    """
    return f"jdbc:hive2://{host}:{port}/default"


def serve(home: str | Path | None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          out: TextIO = sys.stderr) -> None:
    """Serve `home`'s tables over JDBC/ODBC until SIGINT or SIGTERM; then stop cleanly (main thread only).

    Prints one line with the JDBC URL to `out` once clients can connect.
    """
    from py4j.protocol import Py4JJavaError

    from pipelines.lake.registry import CatalogWatch
    from pipelines.query import error_summary
    from pipelines.spark import JARS_DIR, get_spark
    from pipelines.sql.database import connect

    lake = connect(home).lake  # a folder that is no home fails before Spark starts
    if not (JARS_DIR / SANDBOX_JAR).is_file():
        raise RuntimeError(f"the SQL sandbox {JARS_DIR / SANDBOX_JAR} is missing; run `bash .ci/setup` once "
                           "(it compiles jvm/sandbox with javac)")
    spark = get_spark(app_name="seclake-serve", ui=False, conf=server_conf(host, port))
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # the session above started it
    jvm.seclake.sandbox.SqlSandbox.trust(spark._jsparkSession)  # this session registers the tables
    # The Thrift server's Hive client starts Derby, which writes ./derby.log where the command runs.
    jvm.java.lang.System.setProperty("derby.stream.error.file", str(lake.home.root / "derby.log"))
    watch = CatalogWatch(lake, spark)
    watch.refresh()
    try:
        server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithSparkSession(
            spark._jsparkSession, False)  # False: a server error raises here instead of exiting the JVM
    except Py4JJavaError as exc:
        spark.stop()
        raise RuntimeError(f"cannot listen on {host}:{port}: {error_summary(exc)}") from None
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: stop.set())
    try:
        watch.refresh()
        print(f"seclake serve: {len(watch.names())} tables of {lake.home.root} at {jdbc_url(host, port)} "
              "(read-only; Ctrl-C stops)", file=out, flush=True)
        while not stop.wait(REGISTER_SECONDS):
            watch.refresh()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()
        spark.stop()
        print("seclake serve: stopped", file=out, flush=True)
