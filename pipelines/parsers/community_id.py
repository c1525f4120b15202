"""Community ID v1 flow hash as native Spark SQL expressions.

Spec: https://github.com/corelight/community-id-spec (seed 0). The hash input is
seed(2) . saddr(4|16) . daddr(4|16) . proto(1) . pad(1) [. sport(2) . dport(2)], all in
network byte order, with the endpoints ordered so the smaller (addr, port) comes first.
We build that input as a hex string (fixed-width upper-case hex compares like the bytes it
encodes), then `unhex` -> `sha1` -> base64. IPv4 and IPv6 (with '::' compression, an
embedded dotted quad or a zone id) are supported, without lambdas (see common.py).
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from pipelines.parsers.common import Query

PROTO_NUMBERS = {"tcp": 6, "udp": 17, "sctp": 132}
ICMP, ICMP6 = 1, 58

# ICMP types that have a counterpart (request <-> reply), as Zeek maps them. A type not
# listed is "one way": its code takes the destination port's place and no reordering happens.
ICMP_COUNTERPARTS = {0: 8, 8: 0, 9: 10, 10: 9, 13: 14, 14: 13, 15: 16, 16: 15, 17: 18, 18: 17}
ICMP6_COUNTERPARTS = {128: 129, 129: 128, 130: 131, 131: 130, 133: 134, 134: 133,
                      135: 136, 136: 135, 139: 140, 140: 139, 144: 145, 145: 144}


def _ipv4_hex(ip: str) -> str:
    octets = [f"CAST(get(split({ip}, '\\\\.'), {i}) AS INT)" for i in range(4)]
    in_range = " AND ".join(f"{o} <= 255" for o in octets)
    hexed = ", ".join(f"lpad(hex({o}), 2, '0')" for o in octets)
    return f"CASE WHEN {ip} RLIKE '^[0-9]{{1,3}}(\\\\.[0-9]{{1,3}}){{3}}$' AND {in_range} THEN concat({hexed}) END"


def add_ip_hex(q: Query, **addresses: str) -> Query:
    """For each `out=ip` pair add column `out`: the IPv4/IPv6 address in column `ip` as upper-case hex of
    its network-order bytes; NULL when the address does not parse. Leaves `_<out>_*` helper columns.

    >>> add_ip_hex(Query(["ip"]), h="ip").build(spark.createDataFrame([("fe80::1",)], "ip string")).first().h
    'FE800000000000000000000000000001'
    """
    a = {o: f"_{o}_a" for o in addresses}
    tail = {o: f"_{o}_tail" for o in addresses}
    full = {o: f"_{o}_full" for o in addresses}
    # IPv6 only: drop a zone id ('fe80::1%eth0'), then turn a dotted-quad tail
    # ('::ffff:10.0.0.1') into two hex groups.
    v6_text = {o: f"CASE WHEN instr(`{ip}`, ':') > 0 THEN lower(substring_index(`{ip}`, '%', 1)) END"
               for o, ip in addresses.items()}
    q.stage("*", **{a[o]: v6_text[o] for o in addresses}, **{tail[o]: f"substring_index({v6_text[o]}, ':', -1)"
                                                            for o in addresses})

    def with_v4_tail(o: str) -> str:
        hexed = f"lower({_ipv4_hex(tail[o])})"
        return (f"CASE WHEN instr({tail[o]}, '.') > 0 THEN concat(left({a[o]}, length({a[o]}) - length({tail[o]})), "
                f"substr({hexed}, 1, 4), ':', substr({hexed}, 5, 4)) ELSE {a[o]} END")

    q.stage("*", **{a[o]: with_v4_tail(o) for o in addresses})

    def expanded(o: str) -> str:
        # '::' stands for the zero groups missing: head '::' rest -> head:0:...:0:rest.
        head, rest = f"substring_index({a[o]}, '::', 1)", f"substring_index({a[o]}, '::', -1)"
        groups = (f"(CASE WHEN {head} = '' THEN 0 ELSE size(split({head}, ':')) END + "
                  f"CASE WHEN {rest} = '' THEN 0 ELSE size(split({rest}, ':')) END)")
        zeros = f"substr(repeat('0:', 8 - {groups}), 1, 2 * (8 - {groups}) - 1)"
        return (f"CASE WHEN size(split({a[o]}, '::')) = 1 THEN {a[o]} "
                f"WHEN size(split({a[o]}, '::', -1)) = 2 AND {groups} < 8 "
                f"THEN concat_ws(':', nullif({head}, ''), {zeros}, nullif({rest}, '')) END")

    q.stage("*", **{full[o]: expanded(o) for o in addresses})

    def hexed(o: str, ip: str) -> str:
        # Left-pad every group to 4 hex digits: prefix '000', keep each group's last 4 digits.
        padded = (f"regexp_replace(concat(':000', replace({full[o]}, ':', ':000')), "
                  f"':[0-9a-f]*?([0-9a-f]{{4}})(?=:|$)', '$1')")
        v6 = f"CASE WHEN {full[o]} RLIKE '^([0-9a-f]{{1,4}}:){{7}}[0-9a-f]{{1,4}}$' THEN upper({padded}) END"
        return f"CASE WHEN instr(`{ip}`, ':') > 0 THEN {v6} ELSE {_ipv4_hex(f'`{ip}`')} END"

    return q.stage("*", **{o: hexed(o, ip) for o, ip in addresses.items()})


def _counterpart(icmp_type: str, table: dict[int, int]) -> str:
    return f"CASE {icmp_type} " + " ".join(f"WHEN {k} THEN {v}" for k, v in table.items()) + " END"


def with_community_id(df: DataFrame, out: str, src_ip: str, dst_ip: str, src_port: str, dst_port: str,
                      proto: str) -> DataFrame:
    """`df` plus column `out`: the Community ID v1 (seed 0) of each row's flow; NULL when a part is missing or bad.

    The arguments name columns; see `add_community_id`.

    >>> df = spark.createDataFrame([("128.232.110.120", "66.35.250.204", 34855, 80, "tcp")],
    ...                            "s string, d string, sp int, dp int, p string")
    >>> with_community_id(df, "cid", "s", "d", "sp", "dp", "p").first().cid
    '1:LQU9qZlK+B5F3KDmev6m5PMibrg='
    """
    q = add_community_id(Query(df.columns), out, src_ip, dst_ip, src_port, dst_port, proto)
    return q.stage([*df.columns, out]).build(df)


def add_community_id(q: Query, out: str, src_ip: str, dst_ip: str, src_port: str, dst_port: str,
                     proto: str, src_hex: str | None = None, dst_hex: str | None = None) -> Query:
    """Add column `out`: the Community ID v1 (seed 0) of each row's flow; NULL when a part is missing or bad.

    The arguments name columns. `proto` holds a lower-case name ('tcp', 'udp', 'sctp', 'icmp';
    ICMPv6 when the addresses are IPv6) or an IP protocol number as a string (port-less
    protocols). For ICMP the ports hold the type (`src_port`) and the code or Zeek's
    counterpart type (`dst_port`), as Zeek and Suricata log them. `src_hex`/`dst_hex` name
    columns already holding `add_ip_hex` of the addresses, to avoid computing them twice.
    Leaves `_<out>_*` helper columns.
    """
    s, d, sp, dp, num, one_way, ordered = (f"_{out}_{n}" for n in ("s", "d", "sp", "dp", "num", "oneway", "ord"))
    if src_hex is None or dst_hex is None:
        add_ip_hex(q, **{s: src_ip, d: dst_ip})
        src_hex, dst_hex = s, d
    p, sh, dh = f"`{proto}`", f"`{src_hex}`", f"`{dst_hex}`"
    v6 = f"length({sh}) = 32"
    has_ports = f"{p} IN ('tcp', 'udp', 'sctp', 'icmp')"
    counterpart = (f"CASE WHEN {v6} THEN {_counterpart(f'`{src_port}`', ICMP6_COUNTERPARTS)} "
                   f"ELSE {_counterpart(f'`{src_port}`', ICMP_COUNTERPARTS)} END")
    numbers = " ".join(f"WHEN {p} = '{name}' THEN {value}" for name, value in PROTO_NUMBERS.items())
    q.stage("*", **{
        num: f"CASE WHEN {p} = 'icmp' THEN CASE WHEN {v6} THEN {ICMP6} ELSE {ICMP} END {numbers} "
             f"WHEN {p} RLIKE '^[0-9]{{1,3}}$' THEN try_cast({p} AS INT) END",
        one_way: f"({p} = 'icmp' AND {counterpart} IS NULL)",
        sp: f"`{src_port}`",
        dp: f"CASE WHEN {p} = 'icmp' THEN coalesce({counterpart}, `{dst_port}`) ELSE `{dst_port}` END",
    })
    port_hex = "CASE WHEN {has} AND {v} BETWEEN 0 AND 65535 THEN lpad(hex({v}), 4, '0') END"
    q.stage("*", **{sp: port_hex.format(has=has_ports, v=sp), dp: port_hex.format(has=has_ports, v=dp)})
    q.stage("*", **{ordered: f"({one_way} OR concat({sh}, coalesce({sp}, '')) <= concat({dh}, coalesce({dp}, '')))"})
    addrs = f"CASE WHEN {ordered} THEN concat({sh}, {dh}) ELSE concat({dh}, {sh}) END"
    ports = f"CASE WHEN NOT {has_ports} THEN '' WHEN {ordered} THEN concat({sp}, {dp}) ELSE concat({dp}, {sp}) END"
    # concat() is NULL when any part is NULL, so a bad address or a missing port gives NULL.
    data = f"concat('0000', {addrs}, lpad(hex({num}), 2, '0'), '00', {ports})"
    valid = f"length({sh}) = length({dh}) AND {num} BETWEEN 0 AND 255"
    return q.stage("*", **{out: f"CASE WHEN {valid} THEN concat('1:', base64(unhex(sha1(unhex({data}))))) END"})
