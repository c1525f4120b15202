"""Consumer lag of the ETL from Kafka: messages in the sensors' topics that `etl_kafka` has not
committed yet, from its checkpoint's offsets and the brokers' high watermarks (`seclake kafka lag`,
Dagster's `kafka_lag_sensor`)."""
from __future__ import annotations

import re
from pathlib import Path

from pipelines.checkpoint import newest, read_batch
from pipelines.home import Home


def committed_offsets(checkpoint: Path) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the offset the next micro-batch of the query at `checkpoint` starts at:
    the end offsets of its newest committed batch. Empty before its first commit.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     root = Path(tmp)
    ...     (root / "offsets").mkdir(); (root / "commits").mkdir()
    ...     _ = (root / "offsets" / "3").write_text('v1\\n{"batchWatermarkMs":0}\\n{"zeek.dns":{"0":42}}\\n'
    ...                                            '{"suricata.eve":{"0":7}}')
    ...     _ = (root / "commits" / "3").write_text("v1\\n{}")
    ...     committed_offsets(root)
    {('zeek.dns', 0): 42, ('suricata.eve', 0): 7}
    """
    last = newest(checkpoint, committed=True)
    if last is None:
        return {}
    return {(topic, int(partition)): int(offset)
            for source in read_batch(checkpoint, last).offsets  # one Kafka source per log source
            for topic, partitions in source.items() for partition, offset in partitions.items()}


def consumer_lag(home: Home, bootstrap: str, timeout_s: float = 15.0) -> dict[str, int]:
    """`<topic>/<partition>` -> messages the ETL from Kafka has not committed yet, for every
    partition of the topics it reads (a topic it never read counts from its first offset).
    ValueError in one line when no broker answers."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from pipelines.etl import KAFKA_QUERY_NAME, check_reachable, kafka_topics
    from pipelines.parsers.sources import sources

    check_reachable(bootstrap, timeout_s)
    done = committed_offsets(home.checkpoint(KAFKA_QUERY_NAME))
    patterns = [re.compile(kafka_topics(s.name)) for s in sources()]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "seclake-lag", "enable.auto.commit": False})
    lag: dict[str, int] = {}
    try:
        for topic, meta in sorted(consumer.list_topics(timeout=timeout_s).topics.items()):
            if not any(p.fullmatch(topic) for p in patterns):
                continue
            for partition in sorted(meta.partitions):
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
                except KafkaException as exc:
                    raise ValueError(f"Kafka at {bootstrap} gave no offsets for {topic}: {exc.args[0].str()}") from None
                lag[f"{topic}/{partition}"] = max(0, high - max(low, done.get((topic, partition), low)))
    finally:
        consumer.close()
    return lag
