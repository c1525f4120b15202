"""`seclake maintain`: per table, OPTIMIZE (compaction), VACUUM and a Delta log checkpoint.

Safe beside readers: compaction commits with `dataChange: false` (streams skip it) and VACUUM
keeps every file younger than `Settings.vacuum_retention_hours`, Delta's 7-day floor. It is not
run while `seclake stream` runs, like every operator command (`pipelines/operations/running.py`).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

from pyspark.sql import SparkSession

from pipelines.lake.admin import FileStats, file_stats
from pipelines.lake.registry import Lake
from pipelines.settings import Settings

MIN_RETENTION_HOURS = 168  # Delta's own floor (retentionDurationCheck); shorter can break a lagging stream
# The columns of `TableMaintenance.cells`: `seclake maintain`'s closing table.
MAINTENANCE_COLUMNS: tuple[str, ...] = ("table", "files", "MiB", "files after", "MiB after", "vacuumed")


@dataclass(frozen=True)
class TableMaintenance:
    """One table before and after (`after` None in a dry run); `vacuumed` files removed."""

    table: str
    before: FileStats
    after: FileStats | None = None
    vacuumed: int = 0

    def line(self) -> str:
        """One aligned line: files and MiB before -> after.

        >>> TableMaintenance("silver_dns", FileStats(12, 3 * 2**20), FileStats(2, 2 * 2**20), 0).line()
        'silver_dns            12 files    3.0 MiB -> 2 files    2.0 MiB, 0 vacuumed'
        """
        head = f"{self.table:<20} {self.before.files:>3} files {self.before.size_bytes / 2**20:>6.1f} MiB"
        if self.after is None:
            return f"{head} (dry run: would OPTIMIZE, VACUUM, checkpoint the log)"
        return (f"{head} -> {self.after.files} files {self.after.size_bytes / 2**20:>6.1f} MiB, "
                f"{self.vacuumed} vacuumed")

    def cells(self) -> tuple[object, ...]:
        """One row under MAINTENANCE_COLUMNS (None after, in a dry run).

        >>> TableMaintenance("silver_dns", FileStats(12, 3 * 2**20)).cells()
        ('silver_dns', 12, 3.0, None, None, None)
        """
        after = self.after
        return (self.table, self.before.files, self.before.size_bytes / 2**20,
                after and after.files, after and after.size_bytes / 2**20, after and self.vacuumed)


def maintain(spark: SparkSession | Callable[[], SparkSession] | None, lake: Lake, settings: Settings = Settings(),
             dry_run: bool = False, on_table: Callable[[TableMaintenance], None] | None = None
             ) -> list[TableMaintenance]:
    """Compact, vacuum and checkpoint every table of `lake`; a dry run only reads the logs.
    `on_table` hears of each table as it is done (`seclake maintain`'s progress). `spark` may be a
    function making the session, called once the home's writer lock is held: a refusal comes
    before a JVM starts."""
    from pipelines.lake.admin import write_log_checkpoint
    from pipelines.lake.maintenance import compact, vacuum
    from pipelines.operations.running import refuse_while_streaming, writer_lock

    if not dry_run:  # a dry run only reads: a look at the plan while the stream runs
        refuse_while_streaming(lake.home, "maintenance")
    if settings.vacuum_retention_hours < MIN_RETENTION_HOURS:
        raise ValueError(f"vacuum_retention_hours must be >= {MIN_RETENTION_HOURS} (Delta's floor: a lagging "
                         f"stream or time travel would lose files), not {settings.vacuum_retention_hours}")
    done = []
    with nullcontext() if dry_run else writer_lock(lake.home, "seclake maintain"):
        if callable(spark) and not dry_run:
            spark = spark()
        for name in (n for n in lake.names() if lake.exists(n)):
            path = lake.path(name)
            before = file_stats(path)
            if dry_run or not isinstance(spark, SparkSession):
                done.append(TableMaintenance(name, before))
            else:
                with lake.home.commit_lock(name):  # `rules enable`, a backtest may commit meanwhile
                    compact(spark, path)
                    removed = vacuum(spark, path, retention_hours=settings.vacuum_retention_hours)
                    write_log_checkpoint(spark, path)
                done.append(TableMaintenance(name, before, file_stats(path), len(removed)))
            if on_table:
                on_table(done[-1])
    return done
