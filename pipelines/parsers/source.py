"""What a log source declares: where its files land, how they are cut into lines and parsed, and
which silver table each kind of event goes to. One `Source` per module (`zeek.py`, `suricata.py`),
listed once in `sources.py`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pipelines.parsers.common import Query


@dataclass(frozen=True)
class Source:
    """One log source, e.g. Zeek.

    `name` is the landing folder (`landing/<name>/`), the bronze table (`bronze_<name>`) and the
    value of every row's `source` column.

    `parse` adds steps to a Query over the source's data lines (columns `source`, `file`,
    `line_number`, `raw`, `valid_utf8` and `block_columns`) that end with at least `source`,
    `file`, `line_number`, `raw`, `sensor`, `kind`, `error` (NULL when the line parsed, else a short
    reason), `event_time`, and the silver payload columns the source has, named as in
    `pipelines/schemas.py` (absent ones become NULL). `common.py` has the checks every line needs.

    `silver` maps each kind the source yields to the silver table it feeds; kinds not listed stay
    in bronze only. `flows` are the kinds that carry a 5-tuple (`src_ip`, `src_port`, `dst_ip`,
    `dst_port`, `proto`): their addresses are validated and given a Community ID; `address_labels`
    are the source's own names for the two addresses, used in quarantine reasons.

    A file is one block of lines unless `header_blocks` cuts it into blocks that each carry a
    header (Zeek's `#fields`); `block_columns` are the columns it adds to every line, and lines
    starting with `comment_prefix` are headers, not data.

    >>> from pipelines.parsers.sources import get_source
    >>> get_source("suricata").silver["alert"]
    'silver_ids_alerts'
    """

    name: str
    description: str
    parse: Callable[[Query], Query]
    silver: Mapping[str, str]
    flows: tuple[str, ...] = ()
    address_labels: tuple[str, str] = ("src_ip", "dst_ip")
    header_blocks: Callable[[Query], None] | None = None
    block_columns: tuple[str, ...] = field(default=())
    comment_prefix: str | None = None

    @property
    def bronze_table(self) -> str:
        """The bronze table of this source's raw lines.

        >>> from pipelines.parsers.sources import get_source
        >>> get_source("zeek").bronze_table
        'bronze_zeek'
        """
        return f"bronze_{self.name}"
