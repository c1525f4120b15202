package seclake.lake;

import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.delta.DeltaLog;
import org.apache.spark.sql.delta.DeltaOperations;
import org.apache.spark.sql.delta.DeltaOptions;
import org.apache.spark.sql.delta.OptimisticTransaction;
import org.apache.spark.sql.delta.VersionChecksum;
import org.apache.spark.sql.delta.actions.Action;
import org.apache.spark.sql.delta.actions.AddFile;
import org.apache.spark.sql.delta.actions.SetTransaction;
import org.apache.spark.sql.delta.commands.DMLUtils;
import org.apache.spark.sql.delta.commands.WriteIntoDelta;

import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Delta's idempotent append (txnAppId/txnVersion) without its full state reconstruction.
 *
 * <p>delta-spark 4.4.0 looks an application's last version up in {@code Snapshot.transactions},
 * which rebuilds the table's whole state (three Spark jobs, ~1 s on a small table, growing with
 * the table) on every micro-batch. The same answer is in the snapshot's checksum file
 * ({@code <version>.crc}, which Delta writes after each commit with the table's set
 * transactions), so it is read from there; when the checksum is missing or lacks them (a crash
 * between a commit and its checksum, a table written by another engine) Delta's own look-up runs.
 * Everything else is Delta's write path unchanged: {@code WriteIntoDelta} writes the files and
 * builds the actions (the SetTransaction included), the transaction commits them, and the app id
 * is recorded as read, so a concurrent commit by a writer with the same app id fails this one
 * with Delta's ConcurrentTransactionException.
 */
public final class IdempotentAppend {
  private IdempotentAppend() {}

  /**
   * Appends {@code data} to the Delta table at {@code path} as version {@code txnVersion} of
   * application {@code appId}, with schema merging. Returns {committed table version, rows
   * written}, or {-1, 0} when the table's log already holds that version (nothing is written).
   */
  public static long[] append(Dataset<Row> data, String path, String appId, long txnVersion,
                              List<String> partitionBy) {
    SparkSession spark = data.sparkSession();
    DeltaLog log = DeltaLog.forTable(spark, path);
    Map<String, String> opts = new HashMap<>();
    opts.put(DeltaOptions.TXN_APP_ID(), appId);
    opts.put(DeltaOptions.TXN_VERSION(), Long.toString(txnVersion));
    opts.put(DeltaOptions.MERGE_SCHEMA_OPTION(), "true");
    DeltaOptions options = new DeltaOptions(scalaMap(opts), spark.sessionState().conf());
    Seq<String> partitions = CollectionConverters.asScala(partitionBy).toSeq();
    return log.withNewTransaction(Option.empty(), Option.empty(), txn -> {
      if (lastVersion(txn, appId) >= txnVersion) {
        return new long[] {-1L, 0L};
      }
      WriteIntoDelta write = new WriteIntoDelta(log, SaveMode.Append, options, partitions,
          scalaMap(new HashMap<>()), data, Option.empty(), Option.empty(), false);
      DMLUtils.TaggedCommitData<Action> commit =
          write.writeAndReturnCommitData(txn, spark, Option.empty(), false);
      DeltaOperations.Write operation = new DeltaOperations.Write(SaveMode.Append,
          Option.apply(partitions), Option.empty(), Option.empty(), Option.empty(), Option.empty(),
          Option.apply(true), Option.empty(), Option.empty());
      Option<Object> version = txn.commitIfNeeded(commit.actions(), operation, commit.stringTags());
      long rows = 0;
      for (Action action : CollectionConverters.asJava(commit.actions())) {
        if (action instanceof AddFile) {
          Option<Object> records = ((AddFile) action).numLogicalRecords();
          rows += records.isDefined() ? (Long) records.get() : 0L;
        }
      }
      return new long[] {version.isDefined() ? (Long) version.get() : -1L, rows};
    });
  }

  /** The last version of {@code appId} in the transaction's snapshot, -1 if none. */
  static long lastVersion(OptimisticTransaction txn, String appId) {
    Option<VersionChecksum> checksum = txn.snapshot().checksumOpt();
    if (checksum.isEmpty() || checksum.get().setTransactions().isEmpty()) {
      return txn.txnVersion(appId);
    }
    // What txnVersion records: a concurrent commit with this app id now conflicts with ours.
    txn.readTxn().$plus$eq(appId);
    for (SetTransaction known : CollectionConverters.asJava(checksum.get().setTransactions().get())) {
      if (known.appId().equals(appId)) {
        return known.version();
      }
    }
    return -1L;
  }

  private static scala.collection.immutable.Map<String, String> scalaMap(Map<String, String> map) {
    return scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(map));
  }
}
