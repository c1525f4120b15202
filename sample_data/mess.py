"""Real-world mess applied to one file's lines: duplicates, malformed lines, swaps.

Only ever *adds* lines (duplicates, malformed copies) or *reorders* good lines, so every
good event stays in the output exactly once as a well-formed line and ground truth never
points at an event that was destroyed.

- duplicate: a byte-identical copy of a good line, placed 0-3 lines after the original
  (never more than 120 s of write time later), as a log shipper's retry would.
- malformed: an extra line derived from a good line that is not a valid event: for JSON a
  truncated object, possibly ending in invalid UTF-8 bytes; for Zeek TSV a line with too
  few fields (truncated), one extra field, or truncated with invalid UTF-8 bytes.
- out of order: a good line swapped with one of the next 3 good lines whose write time is
  at most 10 s later.

Invalid UTF-8 bytes are carried in ``str`` as surrogate escapes; encode the file with
``errors="surrogateescape"``.
"""
from __future__ import annotations

import random

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


def apply_mess(
    items: list[tuple[int, str, str]], rng: random.Random, tsv: bool, duplicate_rate: float,
    malformed_rate: float, out_of_order_rate: float,
) -> tuple[list[str], dict[str, dict[str, int]]]:
    """``items`` = [(write_us, kind, line)] sorted by write time. Returns the lines to write
    and per-kind counts {kind: {"events", "duplicates", "malformed", "out_of_order"}}."""
    stats: dict[str, dict[str, int]] = {}

    def st(kind: str) -> dict[str, int]:
        s = stats.get(kind)
        if s is None:
            s = stats[kind] = {"events": 0, "duplicates": 0, "malformed": 0, "out_of_order": 0}
        return s

    out: list[tuple[int, str, str, int]] = []
    pending: list[tuple[int, int, str, str]] = []   # (due position, write_us, kind, line)
    rnd = rng.random
    for wts, kind, line in items:
        s = st(kind)
        s["events"] += 1
        if pending:
            keep = []
            for due, pw, pk, pl in pending:
                if len(out) >= due or wts - pw > 120 * US:
                    out.append((pw, pk, pl, DUP))
                else:
                    keep.append((due, pw, pk, pl))
            pending = keep
        out.append((wts, kind, line, GOOD))
        if duplicate_rate and rnd() < duplicate_rate:
            pending.append((len(out) + rng.randrange(0, 4), wts, kind, line))
            s["duplicates"] += 1
        if malformed_rate and rnd() < malformed_rate:
            out.append((wts, kind, malformed(line, tsv, rng), BAD))
            s["malformed"] += 1
    for _, pw, pk, pl in pending:
        out.append((pw, pk, pl, DUP))
    if out_of_order_rate:
        n = len(out)
        for i in range(n - 1):
            if out[i][3] != GOOD or rnd() >= out_of_order_rate:
                continue
            j = i + 1 + rng.randrange(3)
            if j < n and out[j][3] == GOOD and out[j][0] - out[i][0] <= 10 * US and out[j][2] != out[i][2]:
                out[i], out[j] = out[j], out[i]
                st(out[j][1])["out_of_order"] += 1
    return [o[2] for o in out], stats
