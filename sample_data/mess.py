"""Real-world mess applied to one file's lines: duplicates, malformed lines, swaps.

Only ever *adds* lines (duplicates, malformed copies) or *reorders* good lines, so every
good event stays in the output exactly once as a well-formed line and ground truth never
points at an event that was destroyed.

- duplicate: a byte-identical copy of a good line, placed after the original and at most
  3 good lines further (never more than 120 s of write time later), as a log shipper's
  retry would.
- malformed: an extra line derived from a good line that is not a valid event: for JSON a
  truncated object, possibly ending in invalid UTF-8 bytes; for Zeek TSV a line with too
  few fields (truncated), one extra field, or truncated with invalid UTF-8 bytes.
- out of order: a good line swapped with one of the next 3 lines whose write time is at
  most 10 s later (each line takes part in at most one swap).

Invalid UTF-8 bytes are carried in ``str`` as surrogate escapes; encode the file with
``errors="surrogateescape"``.
"""
from __future__ import annotations

import math
import random
from collections import Counter

US = 1_000_000
GOOD, DUP, BAD = 0, 1, 2
_BAD_BYTES = ("\udcc3(", "\udcff\udcfe", "\udce2\udc82", "\udca0\udca1\udcff")


def malformed(line: str, tsv: bool, rng: random.Random) -> str:
    """A line that no parser may accept as an event, derived from ``line``."""
    variant = rng.randrange(3)
    if tsv:
        fields = line.split("\t")
        if variant == 0:      # truncated mid-record: too few fields
            k = rng.randrange(2, max(3, len(fields) - 1))
            return "\t".join(fields[:k])
        if variant == 1:      # one field too many
            return line + "\t" + fields[rng.randrange(1, len(fields))]
        k = rng.randrange(2, max(3, len(fields) - 2))   # truncated and garbled bytes
        return "\t".join(fields[:k]) + _BAD_BYTES[rng.randrange(len(_BAD_BYTES))]
    cut = rng.randrange(10, max(11, len(line) - 2))
    if variant == 2:
        return line[:cut] + _BAD_BYTES[rng.randrange(len(_BAD_BYTES))] + line[cut:cut + 5].replace("}", "")
    return line[:cut]


def positions(rng: random.Random, n: int, p: float) -> list[int]:
    """Indices in [0, n) each chosen with probability ``p`` (geometric gaps, so the cost is
    proportional to the number chosen, not to ``n``)."""
    if p <= 0 or n <= 0:
        return []
    if p >= 1:
        return list(range(n))
    out = []
    lg = math.log(1.0 - p)
    i = -1
    rnd = rng.random
    while True:
        i += 1 + int(math.log(1.0 - rnd()) / lg)
        if i >= n:
            return out
        out.append(i)


def apply_mess(
    items: list[tuple], rng: random.Random, tsv: bool, duplicate_rate: float,
    malformed_rate: float, out_of_order_rate: float, kind: str | None = None,
) -> tuple[list[str], dict[str, dict[str, int]]]:
    """``items`` = [(write_us, kind, line)] (or [(write_us, line)] with ``kind`` given),
    sorted by write time. Returns the lines to write and per-kind counts
    {kind: {"events", "duplicates", "malformed", "out_of_order"}}."""
    n = len(items)
    if kind is None:
        wts = [it[0] for it in items]
        kinds = [it[1] for it in items]
        lines = [it[2] for it in items]
        stats = {k: {"events": c, "duplicates": 0, "malformed": 0, "out_of_order": 0}
                 for k, c in sorted(Counter(kinds).items())}
    else:
        wts = [it[0] for it in items]
        kinds = None
        lines = [it[1] for it in items]
        stats = {kind: {"events": n, "duplicates": 0, "malformed": 0, "out_of_order": 0}} if n else {}

    def k_of(i: int) -> str:
        return kinds[i] if kinds is not None else kind

    # swaps first, among the good lines
    moved: set[int] = set()
    for i in positions(rng, n - 1, out_of_order_rate):
        j = i + 1 + rng.randrange(3)
        if j >= n or i in moved or j in moved or wts[j] - wts[i] > 10 * US:
            continue
        lines[i], lines[j] = lines[j], lines[i]
        wts[i], wts[j] = wts[j], wts[i]
        if kinds is not None:
            kinds[i], kinds[j] = kinds[j], kinds[i]
        moved.update((i, j))
        stats[k_of(j)]["out_of_order"] += 1
    # then extra lines, each inserted after a position of the (swapped) good lines
    ins: list[tuple[int, int, int, str]] = []
    seq = 0
    for i in positions(rng, n, duplicate_rate):
        j = min(n - 1, i + rng.randrange(4))
        while j > i and wts[j] - wts[i] > 120 * US:
            j -= 1
        ins.append((j, 1, seq, lines[i]))
        seq += 1
        stats[k_of(i)]["duplicates"] += 1
    for i in positions(rng, n, malformed_rate):
        ins.append((i, 0, seq, malformed(lines[i], tsv, rng)))
        seq += 1
        stats[k_of(i)]["malformed"] += 1
    if not ins:
        return lines, stats
    ins.sort()
    out: list[str] = []
    prev = 0
    for j, _, _, extra in ins:
        out.extend(lines[prev:j + 1])
        out.append(extra)
        prev = j + 1
    out.extend(lines[prev:])
    return out, stats
