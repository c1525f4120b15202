"""What the two sensors write: Zeek conn/dns/dhcp (TSV or JSON) and Suricata EVE lines.

A :class:`Sink` turns one observed network transaction (a TCP/UDP connection, a DNS
query, a DHCP exchange, an IDS signature match) into the log lines *both* sensors would
write for it, with the ids that tie them together: the Zeek ``uid`` (conn and dns rows
share it; dhcp rows list it in ``uids``), the Suricata ``flow_id`` (flow, dns, dhcp and
alert events of one flow share it) and the Community ID (same value in a Zeek conn row and
in the Suricata events of that connection).

Times are integers in microseconds since the epoch, UTC, everywhere in this package, so
that the same instant prints identically in Zeek and Suricata lines.

Every line is kept with its *write time* (when the sensor appends it to its log; this
decides the hourly file and the order inside it), which can be later than the event time:
Zeek writes a conn row when the connection is removed from its state table, Suricata a
flow record when the flow times out.
"""
from __future__ import annotations

import binascii
import json
import random
from datetime import datetime, timezone
from functools import lru_cache

from .community_id import TCP, UDP, community_id_v1

US = 1_000_000

# --- Zeek field sets (Zeek 7.x with community-id-logging loaded) ---------------------------

CONN_FIELDS = (
    "ts", "uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto", "service",
    "duration", "orig_bytes", "resp_bytes", "conn_state", "local_orig", "local_resp",
    "missed_bytes", "history", "orig_pkts", "orig_ip_bytes", "resp_pkts", "resp_ip_bytes",
    "tunnel_parents", "ip_proto", "community_id",
)
CONN_TYPES = (
    "time", "string", "addr", "port", "addr", "port", "enum", "string", "interval", "count",
    "count", "string", "bool", "bool", "count", "string", "count", "count", "count", "count",
    "set[string]", "count", "string",
)
DNS_FIELDS = (
    "ts", "uid", "id.orig_h", "id.orig_p", "id.resp_h", "id.resp_p", "proto", "trans_id",
    "rtt", "query", "qclass", "qclass_name", "qtype", "qtype_name", "rcode", "rcode_name",
    "AA", "TC", "RD", "RA", "Z", "answers", "TTLs", "rejected",
)
DNS_TYPES = (
    "time", "string", "addr", "port", "addr", "port", "enum", "count", "interval", "string",
    "count", "string", "count", "string", "count", "string", "bool", "bool", "bool", "bool",
    "count", "vector[string]", "vector[interval]", "bool",
)
DHCP_FIELDS = (
    "ts", "uids", "client_addr", "server_addr", "mac", "host_name", "client_fqdn", "domain",
    "requested_addr", "assigned_addr", "lease_time", "client_message", "server_message",
    "msg_types", "duration",
)
DHCP_TYPES = (
    "time", "set[string]", "addr", "addr", "string", "string", "string", "string", "addr",
    "addr", "interval", "string", "string", "vector[string]", "interval",
)
ZEEK_SCHEMAS = {
    "conn": (CONN_FIELDS, CONN_TYPES),
    "dns": (DNS_FIELDS, DNS_TYPES),
    "dhcp": (DHCP_FIELDS, DHCP_TYPES),
}
ZEEK_KINDS = ("conn", "dns", "dhcp")
EVE_KINDS = ("alert", "dns", "flow", "dhcp")

QTYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "NULL": 10, "PTR": 12, "MX": 15, "TXT": 16,
          "AAAA": 28, "SRV": 33, "HTTPS": 65}
RCODES = {"NOERROR": 0, "SERVFAIL": 2, "NXDOMAIN": 3, "REFUSED": 5}
DNS_FLAGS = {"NOERROR": "8180", "SERVFAIL": "8182", "NXDOMAIN": "8183", "REFUSED": "8185"}

SURICATA_IFACE = "eth1"
SURICATA_HOST = "ids-sensor-01"

# --- time formatting -----------------------------------------------------------------------


def zeek_ts(us: int) -> str:
    """Zeek TSV ``time``/``interval``: seconds with 6 decimals."""
    if us < US:
        return f"0.{us:06d}"
    s = str(us)
    return s[:-6] + "." + s[-6:]


def zeek_json_num(us: int) -> str:
    """Zeek JSON number: seconds, trailing zeros trimmed (``1332008625.4``, ``0.0``)."""
    s, f = divmod(us, US)
    if f == 0:
        return f"{s}.0"
    return f"{s}.{f:06d}".rstrip("0")


_SECOND: dict[int, str] = {}


def eve_ts(us: int) -> str:
    """Suricata EVE timestamp, e.g. ``2026-11-20T13:00:01.123456+0000``."""
    s = us // US
    p = _SECOND.get(s)
    if p is None:
        if len(_SECOND) > 100_000:
            _SECOND.clear()
        p = _SECOND[s] = datetime.fromtimestamp(s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.")
    u = str(us)
    return p + u[-6:] + "+0000"


def zeek_stamp(us: int) -> str:
    """``#open``/``#close`` and rotated file names: ``2026-11-20-13-00-00``."""
    return datetime.fromtimestamp(us // US, timezone.utc).strftime("%Y-%m-%d-%H-%M-%S")


def iso(us: int) -> str:
    """ISO-8601 UTC with microseconds, as used in ground_truth.jsonl and manifest.json."""
    s, f = divmod(us, US)
    return datetime.fromtimestamp(s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{f:06d}Z"


def zeek_header(path: str, open_us: int) -> str:
    fields, types = ZEEK_SCHEMAS[path]
    return (
        "#separator \\x09\n#set_separator\t,\n#empty_field\t(empty)\n#unset_field\t-\n"
        f"#path\t{path}\n#open\t{zeek_stamp(open_us)}\n"
        "#fields\t" + "\t".join(fields) + "\n#types\t" + "\t".join(types) + "\n"
    )


def zeek_footer(close_us: int) -> str:
    return f"#close\t{zeek_stamp(close_us)}\n"


# --- TCP flag bookkeeping for Suricata flow records ----------------------------------------

_FLAG_BITS = {"s": 0x02, "h": 0x12, "a": 0x10, "d": 0x18, "f": 0x11, "r": 0x04, "t": 0x10}


@lru_cache(maxsize=None)
def _tcp_json(history: str, state: str) -> str:
    """Suricata's ``tcp`` object for a Zeek history string (upper case = originator)."""
    ts = tc = 0
    for ch in history:
        bits = _FLAG_BITS.get(ch.lower(), 0)
        if ch.isupper():
            ts |= bits
        else:
            tc |= bits | (0x10 if ch == "r" else 0)  # a RST answering a SYN carries ACK
    both = ts | tc
    names = [n for n, b in (("fin", 1), ("syn", 2), ("rst", 4), ("psh", 8), ("ack", 16)) if both & b]
    flags = ",".join(f'"{n}":true' for n in names)
    return (f'"tcp":{{"tcp_flags":"{both:02x}","tcp_flags_ts":"{ts:02x}","tcp_flags_tc":"{tc:02x}"'
            f',{flags},"state":"{state}"}}')


# --- the sink ------------------------------------------------------------------------------

_UID_TR = bytes.maketrans(b"+/", b"xQ")
_B2A = binascii.b2a_base64


def _local(ip: str) -> str:
    return "T" if ip.startswith("10.0.") else "F"


class Sink:
    """Collects the lines both sensors write, as ``(write_us, line)`` per Zeek kind and
    ``(write_us, event_type, line)`` for Suricata EVE.

    ``rng`` drives only ids (uids, flow ids, DNS transaction ids) and sensor delays, so a
    sink's output is a pure function of its seed and the calls made on it.
    """

    def __init__(self, rng: random.Random, zeek_json: bool = False):
        self.rng = rng
        self.rnd = rng.random
        self.zeek_json = zeek_json
        self.conn: list[tuple[int, str]] = []
        self.dns_z: list[tuple[int, str]] = []
        self.dhcp_z: list[tuple[int, str]] = []
        self.eve: list[tuple[int, str, str]] = []

    # ids -----------------------------------------------------------------------------------
    def uid(self) -> str:
        """A Zeek-style connection uid: "C" + 16 base62-looking characters."""
        return "C" + _B2A(self.rng.getrandbits(96).to_bytes(12, "big"), newline=False).translate(_UID_TR).decode()

    def flow_id(self) -> int:
        return self.rng.getrandbits(51) | (1 << 40)

    # connections ---------------------------------------------------------------------------
    def conn_flow(
        self, ts: int, oh: str, op: int, rh: str, rp: int, proto: int, service: str | None,
        app_proto: str | None, dur: int | None, ob: int | None, rb: int | None, state: str,
        hist: str, opk: int, oipb: int, rpk: int, ripb: int, alerted: bool = False,
        uid: str | None = None, fid: int | None = None,
    ) -> tuple[str, int, str]:
        """One connection: a Zeek conn row and a Suricata flow record. Returns (uid, flow_id,
        community_id). ``dur``/``ob``/``rb`` are None for single-packet connections (Zeek
        leaves them unset)."""
        uid = uid or self.uid()
        fid = fid or self.flow_id()
        cid = community_id_v1(oh, rh, op, rp, proto)
        pname = "tcp" if proto == TCP else "udp"
        d = dur or 0
        end = ts + d
        # Zeek removes a finished TCP connection ~5 s after close, UDP after 60 s idle.
        if proto == TCP:
            zdelay = 5 * US if state in ("SF", "REJ", "RSTO", "RSTR", "RSTOS0") else 60 * US
            sdelay = 60 * US
            sstate = "new" if state == "S0" else "closed"
        else:
            zdelay = 60 * US
            sdelay = 30 * US if rpk == 0 else 120 * US
            sstate = "new" if rpk == 0 else "established"
        jitter = int(self.rnd() * 2 * US)
        lo, lr = _local(oh), _local(rh)
        if self.zeek_json:
            parts = [f'{{"ts":{zeek_json_num(ts)},"uid":"{uid}","id.orig_h":"{oh}","id.orig_p":{op},'
                     f'"id.resp_h":"{rh}","id.resp_p":{rp},"proto":"{pname}"']
            if service:
                parts.append(f',"service":"{service}"')
            if dur is not None:
                parts.append(f',"duration":{zeek_json_num(dur)}')
            if ob is not None:
                parts.append(f',"orig_bytes":{ob},"resp_bytes":{rb}')
            parts.append(
                f',"conn_state":"{state}","local_orig":{"true" if lo == "T" else "false"},'
                f'"local_resp":{"true" if lr == "T" else "false"},"missed_bytes":0,"history":"{hist}",'
                f'"orig_pkts":{opk},"orig_ip_bytes":{oipb},"resp_pkts":{rpk},"resp_ip_bytes":{ripb},'
                f'"ip_proto":{proto},"community_id":"{cid}"}}'
            )
            line = "".join(parts)
        else:
            line = (
                f"{zeek_ts(ts)}\t{uid}\t{oh}\t{op}\t{rh}\t{rp}\t{pname}\t{service or '-'}\t"
                f"{'-' if dur is None else zeek_ts(dur)}\t{'-' if ob is None else ob}\t"
                f"{'-' if rb is None else rb}\t{state}\t{lo}\t{lr}\t0\t{hist}\t{opk}\t{oipb}\t"
                f"{rpk}\t{ripb}\t-\t{proto}\t{cid}"
            )
        self.conn.append((end + zdelay + jitter, line))

        bts = max(oipb + 14 * opk, 60 * opk)
        btc = max(ripb + 14 * rpk, 60 * rpk)
        ap = f'"app_proto":"{app_proto}",' if app_proto else ""
        tcp = "," + _tcp_json(hist, "syn_sent" if state == "S0" else "closed") if proto == TCP else ""
        wts = end + sdelay + jitter
        eve = (
            f'{{"timestamp":"{eve_ts(wts)}","flow_id":{fid},"in_iface":"{SURICATA_IFACE}",'
            f'"event_type":"flow","src_ip":"{oh}","src_port":{op},"dest_ip":"{rh}","dest_port":{rp},'
            f'"proto":"{pname.upper()}","community_id":"{cid}",{ap}"flow":{{"pkts_toserver":{opk},'
            f'"pkts_toclient":{rpk},"bytes_toserver":{bts},"bytes_toclient":{btc},'
            f'"start":"{eve_ts(ts)}","end":"{eve_ts(end)}","age":{d // US},"state":"{sstate}",'
            f'"reason":"timeout","alerted":{"true" if alerted else "false"}}}{tcp},'
            f'"host":"{SURICATA_HOST}"}}'
        )
        self.eve.append((wts, "flow", eve))
        return uid, fid, cid

    def tcp(
        self, ts: int, oh: str, op: int, rh: str, rp: int, service: str | None,
        app_proto: str | None, dur: int, ob: int, rb: int, state: str = "SF",
        hist: str = "ShADadFf", alerted: bool = False,
    ) -> tuple[str, int, str]:
        """A TCP connection with payload sizes; packet and IP byte counts follow from them."""
        opk = 3 + ob // 1200 + (1 if ob else 0)
        rpk = 2 + rb // 1400 + (1 if rb else 0)
        return self.conn_flow(ts, oh, op, rh, rp, TCP, service, app_proto, dur, ob, rb, state,
                              hist, opk, ob + 52 * opk, rpk, rb + 52 * rpk, alerted)

    # alerts --------------------------------------------------------------------------------
    def alert(
        self, ts: int, flow_start: int, src: str, sport: int, dst: str, dport: int, proto: int,
        fid: int, cid: str, sig: tuple[int, int, str, str, int], app_proto: str | None,
        pkts: tuple[int, int, int, int],
    ) -> None:
        """A Suricata alert on an existing flow (``fid``/``cid`` from :meth:`conn_flow`).
        ``sig`` = (signature_id, rev, signature, category, severity)."""
        sid, rev, msg, cat, sev = sig
        ap = f'"app_proto":"{app_proto}",' if app_proto else ""
        line = (
            f'{{"timestamp":"{eve_ts(ts)}","flow_id":{fid},"in_iface":"{SURICATA_IFACE}",'
            f'"event_type":"alert","src_ip":"{src}","src_port":{sport},"dest_ip":"{dst}",'
            f'"dest_port":{dport},"proto":"{"TCP" if proto == TCP else "UDP"}","pkt_src":"wire/pcap",'
            f'"community_id":"{cid}","alert":{{"action":"allowed","gid":1,"signature_id":{sid},'
            f'"rev":{rev},"signature":{json.dumps(msg)},"category":{json.dumps(cat)},"severity":{sev}}},'
            f'{ap}"direction":"to_server","flow":{{"pkts_toserver":{pkts[0]},"pkts_toclient":{pkts[1]},'
            f'"bytes_toserver":{pkts[2]},"bytes_toclient":{pkts[3]},"start":"{eve_ts(flow_start)}",'
            f'"src_ip":"{src}","dest_ip":"{dst}","src_port":{sport},"dest_port":{dport}}},'
            f'"host":"{SURICATA_HOST}"}}'
        )
        self.eve.append((ts, "alert", line))

    # DNS -----------------------------------------------------------------------------------
    def dns(
        self, ts: int, client: str, resolver: str, qname: str, qtype: str, rcode: str,
        answers: list[tuple[str, str, str, int]], rtt: int, apex: str | None = None,
    ) -> tuple[str, int]:
        """One DNS query over UDP from a fresh source port, answered after ``rtt`` µs.

        ``answers`` = [(owner name, rrtype, rdata, ttl)] in answer-section order.
        Emits the Zeek dns and conn rows and the Suricata query, answer and flow events.
        """
        rnd = self.rnd
        sport = 49152 + int(rnd() * 16383)
        tid = 1 + int(rnd() * 65534)
        qlen = len(qname) + 2
        ob = 12 + qlen + 4 + 11
        rb = ob + sum(12 + (len(r[2]) + 2 if r[1] in ("CNAME", "PTR", "TXT", "NULL") else
                              (16 if r[1] == "AAAA" else 4)) for r in answers)
        if rcode == "NXDOMAIN":
            rb += 60
        uid, fid, cid = self.conn_flow(ts, client, sport, resolver, 53, UDP, "dns", "dns", rtt,
                                       ob, rb, "SF", "Dd", 1, ob + 28, 1, rb + 28)
        qt = QTYPES[qtype]
        rc = RCODES[rcode]
        zans = []
        zttl = []
        for _, rrtype, rdata, ttl in answers:
            if rrtype == "TXT":
                zans.append(f"TXT {len(rdata)} {rdata}")
            elif rrtype == "NULL":
                continue
            else:
                zans.append(rdata)
            zttl.append(ttl)
        rejected = rc != 0
        if self.zeek_json:
            extra = ""
            if zans:
                extra = (',"answers":[' + ",".join(json.dumps(a) for a in zans) + '],"TTLs":['
                         + ",".join(f"{t}.0" for t in zttl) + "]")
            zl = (
                f'{{"ts":{zeek_json_num(ts)},"uid":"{uid}","id.orig_h":"{client}","id.orig_p":{sport},'
                f'"id.resp_h":"{resolver}","id.resp_p":53,"proto":"udp","trans_id":{tid},'
                f'"rtt":{zeek_json_num(rtt)},"query":"{qname}","qclass":1,"qclass_name":"C_INTERNET",'
                f'"qtype":{qt},"qtype_name":"{qtype}","rcode":{rc},"rcode_name":"{rcode}","AA":false,'
                f'"TC":false,"RD":true,"RA":true,"Z":0{extra},"rejected":{"true" if rejected else "false"}}}'
            )
        else:
            za = ",".join(zans) if zans else "-"
            zt = ",".join(f"{t}.000000" for t in zttl) if zttl else "-"
            zl = (
                f"{zeek_ts(ts)}\t{uid}\t{client}\t{sport}\t{resolver}\t53\tudp\t{tid}\t{zeek_ts(rtt)}\t"
                f"{qname}\t1\tC_INTERNET\t{qt}\t{qtype}\t{rc}\t{rcode}\tF\tF\tT\tT\t0\t{za}\t{zt}\t"
                f"{'T' if rejected else 'F'}"
            )
        self.dns_z.append((ts + rtt, zl))

        head = (f'"flow_id":{fid},"in_iface":"{SURICATA_IFACE}","event_type":"dns","src_ip":"{client}",'
                f'"src_port":{sport},"dest_ip":"{resolver}","dest_port":53,"proto":"UDP",'
                f'"pkt_src":"wire/pcap","community_id":"{cid}"')
        self.eve.append((ts, "dns", (
            f'{{"timestamp":"{eve_ts(ts)}",{head},"dns":{{"type":"query","id":{tid},'
            f'"rrname":"{qname}","rrtype":"{qtype}","tx_id":0,"opcode":0}},"host":"{SURICATA_HOST}"}}'
        )))
        body = ""
        if answers:
            items = []
            grouped: dict[str, list[str]] = {}
            for owner, rrtype, rdata, ttl in answers:
                if rrtype == "NULL":
                    items.append(f'{{"rrname":"{owner}","rrtype":"NULL","ttl":{ttl}}}')
                    continue
                items.append(f'{{"rrname":"{owner}","rrtype":"{rrtype}","ttl":{ttl},"rdata":"{rdata}"}}')
                grouped.setdefault(rrtype, []).append(rdata)
            g = ",".join(f'"{k}":[' + ",".join(f'"{v}"' for v in vs) + "]" for k, vs in grouped.items())
            body = ',"answers":[' + ",".join(items) + "]" + (f',"grouped":{{{g}}}' if g else "")
        elif rcode == "NXDOMAIN" and apex:
            body = f',"authorities":[{{"rrname":"{apex}","rrtype":"SOA","ttl":900}}]'
        self.eve.append((ts + rtt, "dns", (
            f'{{"timestamp":"{eve_ts(ts + rtt)}",{head},"dns":{{"version":2,"type":"answer","id":{tid},'
            f'"flags":"{DNS_FLAGS[rcode]}","qr":true,"rd":true,"ra":true,"opcode":0,"rrname":"{qname}",'
            f'"rrtype":"{qtype}","rcode":"{rcode}"{body}}},"host":"{SURICATA_HOST}"}}'
        )))
        return uid, fid

    # DHCP ----------------------------------------------------------------------------------
    def dhcp(
        self, ts: int, kind: str, mac: str, gateway: str, server: str, *, ip: str | None = None,
        hostname: str | None = None, fqdn: str | None = None, domain: str | None = None,
        lease_time: int | None = None, duration: int = 0,
    ) -> tuple[list[str], list[int]]:
        """One DHCP transaction as Zeek logs it (one dhcp row listing its conn uids) and as
        Suricata logs it in extended mode (one event per message).

        kind: ``dora`` (DISCOVER,OFFER,REQUEST,ACK, broadcast), ``reboot`` (REQUEST,ACK after
        a reconnect, asking for the previous address), ``renew`` (REQUEST,ACK unicast to the
        server), ``release`` (RELEASE), ``offer`` (DISCOVER,OFFER: a starvation probe),
        ``discover`` (DISCOVER left unanswered: pool exhausted).
        """
        rng = self.rng
        txid = rng.getrandbits(32)
        if kind == "dora":
            msgs = ("DISCOVER", "OFFER", "REQUEST", "ACK")
        elif kind in ("reboot", "renew"):
            msgs = ("REQUEST", "ACK")
        elif kind == "release":
            msgs = ("RELEASE",)
        elif kind == "offer":
            msgs = ("DISCOVER", "OFFER")
        else:
            msgs = ("DISCOVER",)
        n = len(msgs)
        times = [ts + (duration * i) // max(1, n - 1) for i in range(n)]
        uids: list[str] = []
        fids: list[int] = []
        unicast = kind in ("renew", "release")
        # client side: 0.0.0.0:68 -> 255.255.255.255:67 (broadcast) or ip:68 -> server:67
        c_src, c_dst = (ip, server) if unicast else ("0.0.0.0", "255.255.255.255")
        client_msgs = [i for i, m in enumerate(msgs) if m in ("DISCOVER", "REQUEST", "RELEASE")]
        server_msgs = [i for i, m in enumerate(msgs) if m in ("OFFER", "ACK")]
        opts_len = 300
        if unicast:
            # one flow both ways
            npk_c, npk_s = len(client_msgs), len(server_msgs)
            uid, fid, cid = self.conn_flow(
                ts, c_src, 68, c_dst, 67, UDP, "dhcp", "dhcp", duration if n > 1 else None,
                opts_len * npk_c if n > 1 else None, opts_len * npk_s if n > 1 else None,
                "SF" if npk_s else "S0", "Dd" if npk_s else "D", npk_c, (opts_len + 28) * npk_c,
                npk_s, (opts_len + 28) * npk_s)
            flows = {i: (fid, cid, c_src, 68, c_dst, 67) for i in range(n)}
            uids.append(uid)
            fids.append(fid)
        else:
            flows = {}
            npk = len(client_msgs)
            uid, fid, cid = self.conn_flow(
                times[client_msgs[0]], "0.0.0.0", 68, "255.255.255.255", 67, UDP, "dhcp", "dhcp",
                (times[client_msgs[-1]] - times[client_msgs[0]]) if npk > 1 else None,
                opts_len * npk if npk > 1 else None, 0 if npk > 1 else None, "S0", "D", npk,
                (opts_len + 28) * npk, 0, 0)
            uids.append(uid)
            fids.append(fid)
            for i in client_msgs:
                flows[i] = (fid, cid, "0.0.0.0", 68, "255.255.255.255", 67)
            if server_msgs:
                npk = len(server_msgs)
                uid2, fid2, cid2 = self.conn_flow(
                    times[server_msgs[0]], gateway, 67, "255.255.255.255", 68, UDP, "dhcp", "dhcp",
                    (times[server_msgs[-1]] - times[server_msgs[0]]) if npk > 1 else None,
                    opts_len * npk if npk > 1 else None, 0 if npk > 1 else None, "S0", "D", npk,
                    (opts_len + 28) * npk, 0, 0)
                uids.append(uid2)
                fids.append(fid2)
                for i in server_msgs:
                    flows[i] = (fid2, cid2, gateway, 67, "255.255.255.255", 68)
        # Suricata: one event per message
        for i, m in enumerate(msgs):
            fid, cid, s, sp, d, dp = flows[i]
            t = times[i]
            if m in ("OFFER", "ACK"):
                body = (f'"type":"reply","id":{txid},"client_mac":"{mac}","assigned_ip":"{ip}",'
                        f'"client_ip":"{ip if unicast else "0.0.0.0"}","relay_ip":"{gateway}",'
                        f'"next_server_ip":"0.0.0.0","dhcp_type":"{m.lower()}","lease_time":{lease_time},'
                        f'"renewal_time":{lease_time // 2},"rebinding_time":{lease_time * 7 // 8},'
                        f'"subnet_mask":"255.255.255.0","routers":["{gateway}"],'
                        f'"dns_servers":["10.0.0.53","10.0.0.54"]')
                if domain:
                    body += f',"domain":"{domain}"'
            else:
                cip = ip if unicast else "0.0.0.0"
                body = (f'"type":"request","id":{txid},"client_mac":"{mac}","assigned_ip":"0.0.0.0",'
                        f'"client_ip":"{cip}","dhcp_type":"{m.lower()}"')
                if m == "REQUEST" and not unicast and ip:
                    body += f',"requested_ip":"{ip}"'
                if hostname and m != "RELEASE":
                    body += f',"hostname":"{hostname}"'
            self.eve.append((t, "dhcp", (
                f'{{"timestamp":"{eve_ts(t)}","flow_id":{fid},"in_iface":"{SURICATA_IFACE}",'
                f'"event_type":"dhcp","src_ip":"{s}","src_port":{sp},"dest_ip":"{d}","dest_port":{dp},'
                f'"proto":"UDP","pkt_src":"wire/pcap","community_id":"{cid}","dhcp":{{{body}}},'
                f'"host":"{SURICATA_HOST}"}}'
            )))
        # Zeek: one row per transaction
        answered = bool(server_msgs)
        client_addr = ip if unicast else None
        requested = ip if (kind in ("dora", "reboot")) else None
        assigned = ip if answered else None
        server_addr = server if answered else None
        lt = lease_time if answered else None
        hn = hostname if kind != "release" else None
        fq = fqdn if kind != "release" else None
        dm = domain if answered else None
        if self.zeek_json:
            parts = [f'{{"ts":{zeek_json_num(ts)},"uids":[' + ",".join(f'"{u}"' for u in uids) + "]"]
            for k, v in (("client_addr", client_addr), ("server_addr", server_addr), ("mac", mac),
                         ("host_name", hn), ("client_fqdn", fq), ("domain", dm),
                         ("requested_addr", requested), ("assigned_addr", assigned)):
                if v is not None:
                    parts.append(f',"{k}":"{v}"')
            if lt is not None:
                parts.append(f',"lease_time":{lt}.0')
            parts.append(',"msg_types":[' + ",".join(f'"{m}"' for m in msgs) + "]")
            parts.append(f',"duration":{zeek_json_num(duration)}}}')
            zl = "".join(parts)
        else:
            def u(v):
                return "-" if v is None else v
            zl = (
                f"{zeek_ts(ts)}\t{','.join(uids)}\t{u(client_addr)}\t{u(server_addr)}\t{mac}\t{u(hn)}\t"
                f"{u(fq)}\t{u(dm)}\t{u(requested)}\t{u(assigned)}\t"
                f"{'-' if lt is None else f'{lt}.000000'}\t-\t-\t{','.join(msgs)}\t{zeek_ts(duration)}"
            )
        self.dhcp_z.append((ts + duration, zl))
        return uids, fids
