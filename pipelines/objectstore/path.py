"""Where the lake's tables and checkpoints live: the home folder, or `s3a://bucket/prefix` (`SECLAKE_LAKE`).

Spark and Delta reach object storage through Hadoop's S3A file system (`spark_conf`); the few
file operations seclake does itself on tables and checkpoints (listing a Delta log, a rule's
checkpoint marker, a checkpoint's offsets) go through pyarrow's S3 client; delta-rs reads logs
with `storage_options`. Every location is a `Path`: a local one, or an `ObjectPath` whose I/O
methods talk to the store, so the code that builds and reads locations is the same for both.
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Generator
from pathlib import Path, PosixPath
from typing import Any

from pipelines import environment

SCHEMES = ("s3a", "s3")
# .ci/setup fetches hadoop-aws and the AWS SDK here (pinned in .ci/s3a.pom.xml).
S3A_JARS = Path(__file__).resolve().parents[2] / ".jars" / "s3a"


class ObjectPath(PosixPath):
    """A key prefix in an S3 bucket, used like a local Path: `/`, `name`, `parent`, `exists`,
    `is_dir`, `is_file`, `iterdir`, `glob`, `read_text`, `write_text`, `touch`, `unlink`,
    `replace`; `mkdir` does nothing (a store has no folders). `str()` is the `s3a://` URI Spark
    and Delta take. Anything that would hand it to the local file system (`os.fspath`, `open`)
    raises TypeError instead of touching a local path by the same name.

    >>> p = ObjectPath.from_uri("s3a://lake/home") / "tables" / "silver_dns"
    >>> str(p), p.name, p.key
    ('s3a://lake/home/tables/silver_dns', 'silver_dns', 'lake/home/tables/silver_dns')
    """

    @classmethod
    def from_uri(cls, uri: str) -> "ObjectPath":
        """`s3a://bucket/prefix` (or `s3://`) -> ObjectPath; ValueError naming a bad URI."""
        scheme, sep, rest = uri.partition("://")
        if not sep or scheme not in SCHEMES or not rest.strip("/"):
            raise ValueError(f"not an object-store location: {uri!r}; expected s3a://bucket/prefix")
        return cls("/" + rest.strip("/"))

    def __str__(self) -> str:
        return "s3a:/" + super().__str__()

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __fspath__(self) -> str:
        raise TypeError(f"{self} is on object storage: it has no local file-system path")

    def as_posix(self) -> str:
        return str(self)

    def as_uri(self) -> str:
        return str(self)

    @property
    def key(self) -> str:
        """`bucket/key`, the form pyarrow's S3 client takes."""
        return super().__str__().lstrip("/")

    def _type(self) -> Any:
        return client().get_file_info(self.key).type

    def exists(self, *, follow_symlinks: bool = True) -> bool:
        from pyarrow.fs import FileType

        return bool(self._type() != FileType.NotFound)

    def is_dir(self) -> bool:
        from pyarrow.fs import FileType

        return bool(self._type() == FileType.Directory)

    def is_file(self) -> bool:
        from pyarrow.fs import FileType

        return bool(self._type() == FileType.File)

    def iterdir(self) -> Generator["ObjectPath", None, None]:
        from pyarrow.fs import FileSelector

        for info in client().get_file_info(FileSelector(self.key, allow_not_found=True)):
            yield self / info.base_name

    def glob(self, pattern: str) -> Generator["ObjectPath", None, None]:
        """Keys under this prefix matching `pattern` (`*`, `?`, `**/` as in Path.glob)."""
        from pyarrow.fs import FileSelector

        recursive = "/" in pattern
        wanted = re.compile(_glob_regex(pattern))
        prefix = len(self.key) + 1
        for info in client().get_file_info(FileSelector(self.key, allow_not_found=True, recursive=recursive)):
            relative = info.path[prefix:]
            if wanted.fullmatch(relative):
                yield self / relative

    def rglob(self, pattern: str) -> Generator["ObjectPath", None, None]:
        return self.glob(f"**/{pattern}")

    def read_bytes(self) -> bytes:
        try:
            with client().open_input_stream(self.key) as stream:
                return bytes(stream.read())
        except OSError as exc:
            if not self.exists():
                raise FileNotFoundError(f"no object {self}") from None
            raise exc

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def write_bytes(self, data: Any) -> int:
        with client().open_output_stream(self.key) as stream:
            stream.write(bytes(data))
        return len(data)

    def write_text(self, data: str, encoding: str | None = None, errors: str | None = None,
                   newline: str | None = None) -> int:
        return self.write_bytes(data.encode(encoding or "utf-8", errors or "strict"))

    def touch(self, mode: int = 0o666, exist_ok: bool = True) -> None:
        if self.exists():
            if not exist_ok:
                raise FileExistsError(str(self))
            return
        self.write_bytes(b"")

    def unlink(self, missing_ok: bool = False) -> None:
        if not self.is_file():
            if missing_ok:
                return
            raise FileNotFoundError(f"no object {self}")
        client().delete_file(self.key)

    def replace(self, target: Any) -> "ObjectPath":
        """Move to `target` (copy, then delete: a PUT is atomic, a rename on S3 is not)."""
        destination = target if isinstance(target, ObjectPath) else ObjectPath.from_uri(str(target))
        client().move(self.key, destination.key)
        return destination

    def mkdir(self, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        return None

    def remove_tree(self) -> None:
        """Delete every object under this prefix, and the prefix."""
        if self.exists():
            client().delete_dir(self.key)


def _glob_regex(pattern: str) -> str:
    """A Path.glob pattern as a regex over `/`-separated relative keys.

    >>> bool(re.fullmatch(_glob_regex("rule_*/**/.running"), "rule_a/v1/.running"))
    True
    >>> bool(re.fullmatch(_glob_regex("*.json"), "x/0.json"))
    False
    """
    out = []
    for i, part in enumerate(pattern.split("/")):
        if part == "**":
            out.append("(?:[^/]+/)*")
            continue
        text = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in part)
        out.append(text + ("/" if i < pattern.count("/") else ""))
    return "".join(out)


def as_path(location: str | os.PathLike) -> Path:
    """A table or checkpoint location as a Path: an ObjectPath for `s3a://` and `s3://`, else local.

    >>> as_path("s3a://lake/t"), as_path("/tmp/t")
    (ObjectPath('s3a://lake/t'), PosixPath('/tmp/t'))
    """
    if isinstance(location, Path):
        return location
    text = str(location)
    return ObjectPath.from_uri(text) if text.split("://")[0] in SCHEMES and "://" in text else Path(text)


def remove_tree(location: Path) -> None:
    """Delete a folder (or prefix) and everything in it; nothing if it is not there."""
    import shutil

    if isinstance(location, ObjectPath):
        location.remove_tree()
    else:
        shutil.rmtree(location, ignore_errors=True)


def configured_lake() -> ObjectPath | None:
    """`$SECLAKE_LAKE` as an ObjectPath, or None when the lake is in the home folder."""
    uri = environment.lake()
    return ObjectPath.from_uri(uri) if uri else None


def check_reachable(lake: ObjectPath) -> None:
    """ValueError in one line when `lake`'s bucket cannot be used: the endpoint not answering, the
    credentials refused, the bucket missing. Asked before a home records its lake, so a mistyped
    setting is not recorded as the home's lake."""
    from pyarrow.fs import FileType

    bucket = lake.key.split("/", 1)[0]
    where = environment.s3_endpoint() or "AWS S3"
    try:
        kind = client().get_file_info(bucket).type
    except OSError as exc:
        # A store on plain HTTP, its endpoint written without a scheme, fails as a TLS handshake here
        # (pyarrow takes https; Spark's S3A would take http).
        endpoint = environment.s3_endpoint()
        https = ("; https is assumed without a scheme: http://... for a store on plain HTTP"
                 if endpoint and "://" not in endpoint and "SSL" in str(exc) else "")
        raise ValueError(f"cannot reach the lake {lake} at {where}: {store_error(exc)}{https}") from None
    if kind == FileType.NotFound:
        raise ValueError(f"the lake {lake}: bucket {bucket!r} does not exist at {where}; create it, "
                         "or fix SECLAKE_LAKE")


def store_error(exc: OSError) -> str:
    """An object store client's error in one line, with what to check when it came from the store.

    >>> store_error(OSError("AWS Error ACCESS_DENIED during HeadObject operation: No response body."))
    ... # doctest: +ELLIPSIS
    'AWS Error ACCESS_DENIED during HeadObject operation: No response body. (check SECLAKE_S3_ENDPOINT...)'
    """
    text = str(exc).strip()
    first = text.splitlines()[0].strip() if text else type(exc).__name__
    if any(mark in text for mark in ("AWS Error", "S3 error", "s3a://", "169.254.169.254")):
        first += " (check SECLAKE_S3_ENDPOINT and the AWS_* credentials; docs/deploy.md)"
    return first


def on_object_store(location: str | os.PathLike) -> bool:
    return isinstance(as_path(location), ObjectPath)


@functools.cache
def _client(endpoint: str | None, access_key: str | None, secret_key: str | None, region: str) -> Any:
    from pyarrow.fs import S3FileSystem

    return S3FileSystem(access_key=access_key, secret_key=secret_key, region=region, endpoint_override=endpoint,
                        allow_bucket_creation=True)


def client() -> Any:
    """pyarrow's S3 client for the configured endpoint and credentials (one per configuration)."""
    return _client(environment.s3_endpoint(), environment.aws_access_key_id(), environment.aws_secret_access_key(),
                   environment.aws_region())


def storage_options() -> dict[str, str]:
    """delta-rs's options for the configured store (endpoint, credentials, plain HTTP when asked for)."""
    options = {"AWS_REGION": environment.aws_region()}
    endpoint = environment.s3_endpoint()
    if endpoint:
        options.update(AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true" if endpoint.startswith("http:") else "false")
    for name, value in (("AWS_ACCESS_KEY_ID", environment.aws_access_key_id()),
                        ("AWS_SECRET_ACCESS_KEY", environment.aws_secret_access_key())):
        if value:
            options[name] = value
    return options


def spark_conf() -> dict[str, str]:
    """Spark settings for `s3a://` locations: S3A on the class path, the endpoint and credentials.

    Every session gets them once .ci/setup fetched the jars, so any `s3a://` path works in any
    session (an analyst's too); a lake configured on object storage without them is a
    RuntimeError saying what to run. Why each: the driver's and executors' class path, not
    `spark.jars`, so Hadoop's FileSystem loader sees S3A in every JVM of a cluster (the jars must
    then be at this path on each node); path-style requests and plain HTTP for an S3-compatible
    server (a bucket as a host name needs DNS); credentials in Spark's conf (which redacts them)
    so executors a cluster starts without this environment have them.
    """
    if not any(S3A_JARS.glob("hadoop-aws-*.jar")):
        if configured_lake() is not None:
            raise RuntimeError(f"SECLAKE_LAKE is on object storage but the S3A jars are missing from {S3A_JARS}; "
                               "run `bash .ci/setup` once (it fetches them from Maven Central)")
        return {}
    classpath = f"{S3A_JARS}/*"
    conf = {
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        "spark.hadoop.fs.s3a.endpoint.region": environment.aws_region(),
    }
    endpoint = environment.s3_endpoint()
    if endpoint:
        conf.update({"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.path.style.access": "true",
                     "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https:")).lower()})
    key, secret = environment.aws_access_key_id(), environment.aws_secret_access_key()
    if key and secret:
        conf.update({"spark.hadoop.fs.s3a.access.key": key, "spark.hadoop.fs.s3a.secret.key": secret})
    return conf
