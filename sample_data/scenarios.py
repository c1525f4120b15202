"""Labelled incidents injected into the normal traffic, one per scenario per window.

Planning happens in two steps because scenarios shape the network as well as adding
traffic: :func:`plan_scenarios` picks actors and times (all relative to the window, so
even a short window holds every scenario) and edits presence (an actor must be online;
the roaming laptop and the reused-address pair are scripted); then, after the DHCP
simulation has decided who holds which address when, :func:`emit_scenarios` writes the
scenario traffic and the ground truth. The signal each scenario leaves is documented
in docs/sample-data.md; the constants here are the ones quoted there.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass, field

from .community_id import TCP
from .org import Device, Org
from .sensors import Sink, iso
from .timeline import Plan, Seg, clip, force_present
from .traffic import Traffic

US = 1_000_000
MIN = 60 * US
HOUR = 3600 * US

SCENARIOS = (
    "dns_exfiltration", "dns_tunneling", "dga", "port_scan", "c2_beaconing",
    "ids_alert_reused_ip", "dhcp_starvation", "roaming_laptop", "new_device", "c2_retry",
    "exploit_static_host",
)
# Injected to test attribution (a laptop's traffic must follow each of its leases), not attacks:
# a backtest neither asks a rule to find them nor counts an alert on them as true.
BENIGN = ("roaming_laptop",)

# --- parameters quoted in docs/sample-data.md --------------------------------------------
EXFIL_QUERIES = 320            # queries in the exfiltration window
EXFIL_WINDOW = 10 * MIN        # ... of this length (shorter only if the whole run is < 2 h)
EXFIL_LABELS = (50, 63)        # two data labels per name, base32, lengths in this range
TUNNEL_INTERVAL = 5 * US       # one TXT/NULL query every 5 s +- 1 s
TUNNEL_WINDOW = 20 * MIN
TUNNEL_LABEL = (56, 63)        # first label: hex, length in this range; second label 20-40
DGA_PER_BURST = 45             # queries per burst, all NXDOMAIN except one in the last burst
DGA_BURST_LEN = 60 * US
SCAN_HOSTS = 20
SCAN_PORTS = (21, 22, 23, 25, 53, 80, 81, 88, 110, 111, 135, 139, 143, 389, 443, 445, 465, 587,
              631, 993, 995, 1433, 1521, 1723, 2049, 3306, 3389, 5060, 5432, 5900, 5985, 6379,
              8000, 8080, 8081, 8443, 8888, 9100, 9200, 27017)
SCAN_WINDOW = 4 * MIN
BEACON_INTERVAL = 60 * US
BEACON_JITTER = 3 * US         # uniform +-3 s
STARVATION_MACS = 150
STARVATION_WINDOW = 90 * US
STARVATION_FULL = 0.25         # share of spoofed clients that complete DISCOVER..ACK
RETRY_ATTEMPTS = 90            # refused connections to a dead C2 server ...
RETRY_WINDOW = 12 * MIN        # ... evenly spread (+-2 s) over this; any 10 min window split holds >= 45
RETRY_PORTS = (1604, 4444, 5888, 8443)
STATIC_HOST = 7                # the last octet of a wired address outside the DHCP pool (.10 up)
EXPLOIT_ATTEMPTS = 3           # inbound exploit requests, one IDS alert each, within 60 s

OPEN_PORTS = {
    "server": {22, 53, 80, 88, 135, 139, 389, 443, 445, 3389, 5985},
    "printer": {80, 443, 631, 9100},
    "iot": {80, 443},
}
SIG_SCAN = (2009582, 3, "ET SCAN NMAP -sS window 1024", "Attempted Information Leak", 2)
SIG_SSH_SCAN = (2001219, 20, "ET SCAN Potential SSH Scan", "Attempted Information Leak", 2)
SIG_MALWARE = (2036726, 2, "ET MALWARE Win32/IcedID Request Cookie", "A Network Trojan was detected", 1)
SIG_EXPLOIT = (2034647, 3, "ET EXPLOIT Apache log4j RCE Attempt (http ldap) (CVE-2021-44228)",
               "Attempted Administrator Privilege Gain", 1)
B32 = string.ascii_lowercase + "234567"
HEX = "0123456789abcdef"


@dataclass
class Incident:
    scenario: str
    dev: Device
    start: int
    end: int
    ids: list[str] = field(default_factory=list)
    host_ip: str | None = None
    details: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)     # planning state, not written

    def record(self, idx: int, window: int) -> dict:
        uids = [i for i in self.ids if i.startswith("C")]
        fids = [int(i) for i in self.ids if not i.startswith("C")]
        seen: set[str] = set()
        ids = [i for i in self.ids if not (i in seen or seen.add(i))]
        return {
            "id": f"w{window}-{idx:02d}-{self.scenario}",
            "scenario": self.scenario,
            "host_ip": self.host_ip,
            "mac": self.dev.mac,
            "hostname": self.dev.hostname,
            "in_inventory": self.dev.in_inventory,
            "start": iso(self.start),
            "end": iso(self.end),
            "event_ids": ids,
            "zeek_uids": sorted(set(uids)),
            "suricata_flow_ids": sorted(set(fids)),
            "details": self.details,
        }


def _pick(rng: random.Random, pool: list[Device], used: set[int]) -> Device:
    free = [d for d in pool if d.idx not in used]
    d = rng.choice(free or pool)
    used.add(d.idx)
    return d


def _word(rng: random.Random, org: Org) -> str:
    return org.words[rng.randrange(len(org.words))]


def plan_scenarios(org: Org, plan: Plan, seed: int, window: int = 0
                   ) -> tuple[list[Incident], list[tuple[int, str, int, bool]]]:
    """Pick actors and times, edit ``plan.presence``; returns incidents (without events yet)
    and the spoofed DHCP clients for :func:`timeline.simulate_dhcp`."""
    rng = random.Random(f"{seed}:scenarios:{window}")
    S, E = plan.start, plan.end
    W = E - S

    def at(frac: float) -> int:
        return S + int((frac + rng.uniform(-0.008, 0.008)) * W)

    laptops = [d for d in org.devices if d.device_type == "laptop" and d.in_inventory]
    wifi_clients = [d for d in org.devices if d.device_type in ("laptop", "phone") and d.in_inventory]
    clients = [d for d in org.devices if d.device_type in ("laptop", "desktop") and d.in_inventory]
    wifi_ids = [s.idx for s in org.wifi_subnets]
    used: set[int] = set()
    inc: list[Incident] = []

    # roaming laptop: home Wi-Fi, other building, back, other building again
    lap = _pick(rng, laptops, used)
    other = [s for s in wifi_ids if s != lap.subnet][0]
    marks = [at(0.03), at(0.22), at(0.47), at(0.72), E]
    subs = [lap.subnet, other, lap.subnet, other]
    plan.presence[lap.idx] = clip([Seg(marks[i] + (MIN if i else 0), marks[i + 1], subs[i]) for i in range(4)], S, E)
    inc.append(Incident("roaming_laptop", lap, marks[0], E))

    # reused address: A holds X, alert, A releases X, B gets X
    a = _pick(rng, laptops, used)
    b = _pick(rng, [d for d in wifi_clients if d.idx != a.idx] or laptops, used)
    sub = a.subnet
    other_a = [s for s in wifi_ids if s != sub][0]
    t_join, t_alert, t_rel = at(0.04), at(0.25), at(0.40)
    t_b = t_rel + 90 * US
    plan.presence[a.idx] = clip([Seg(t_join, t_rel, sub, release=True, reserve_for=b.idx),
                                 Seg(t_rel + 10 * MIN, E, other_a)], S, E)
    b.subnet = sub
    plan.presence[b.idx] = clip([Seg(t_b, E, sub, take_ip_of=a.idx)], S, E)
    inc.append(Incident("ids_alert_reused_ip", a, t_alert, t_alert, extra={"b": b, "t_b": t_b}))

    # the rest need an actor online at their time; never one of the scripted devices above,
    # whose segments (release, hand-over, roaming) must stay as written
    scripted = {lap.idx, a.idx, b.idx}

    def actor(pool: list[Device]) -> Device:
        free = [d for d in pool if d.idx not in scripted]
        if not free:
            free = [d for d in clients if d.idx not in scripted] or pool
        return _pick(rng, free, used)

    t0 = at(0.12)
    dur = min(TUNNEL_WINDOW, W // 6)
    d = actor(clients)
    force_present(plan, d, t0 - MIN, t0 + dur + MIN)
    inc.append(Incident("dns_tunneling", d, t0, t0 + dur))

    D = min(2 * HOUR, max(HOUR, W // 2)) if W >= 90 * MIN else W // 2
    t0 = min(at(0.30), E - D - 10 * MIN) if W >= 90 * MIN else S + W // 4
    d = actor(clients)
    force_present(plan, d, t0 - MIN, t0 + D + MIN)
    inc.append(Incident("c2_beaconing", d, t0, t0 + D))

    t0 = at(0.52)
    dur = min(EXFIL_WINDOW, max(MIN, W // 12))
    d = actor(clients)
    force_present(plan, d, t0 - MIN, t0 + dur + MIN)
    inc.append(Incident("dns_exfiltration", d, t0, t0 + dur))

    starts = [at(0.58), at(0.63), at(0.68)]
    d = actor(clients)
    force_present(plan, d, starts[0] - MIN, starts[-1] + 2 * MIN)
    inc.append(Incident("dga", d, starts[0], starts[-1] + DGA_BURST_LEN, extra={"bursts": starts}))

    t0 = at(0.78)
    dur = min(SCAN_WINDOW, max(MIN, W // 25))
    d = actor([c for c in clients if c.device_type == "desktop"] or clients)
    force_present(plan, d, t0 - MIN, t0 + dur + MIN)
    inc.append(Incident("port_scan", d, t0, t0 + dur))

    t0 = at(0.86)
    dur = min(STARVATION_WINDOW, max(30 * US, W // 60))
    d = actor(laptops)
    force_present(plan, d, t0 - MIN, t0 + dur + MIN)
    seg = next(s for s in plan.presence[d.idx] if s.start <= t0 < s.end)
    spoofed = []
    for k in range(STARVATION_MACS):
        mac = ":".join(f"{x:02x}" for x in [rng.randrange(256) & 0xFE] + [rng.randrange(256) for _ in range(5)])
        spoofed.append((t0 + (k * dur) // STARVATION_MACS + rng.randrange(0, 300_000), mac, seg.subnet,
                        rng.random() < STARVATION_FULL))
    inc.append(Incident("dhcp_starvation", d, t0, t0 + dur, extra={"subnet": seg.subnet}))

    # a device nobody registered: a Raspberry Pi plugged into a wired port
    t0 = at(0.50)
    nd = Device(idx=len(org.devices), mac="dc:a6:32:" + ":".join(f"{rng.randrange(256):02x}" for _ in range(3)),
                hostname="raspberrypi", owner="", owner_email="", department="", device_type="unknown",
                os="Raspberry Pi OS", first_seen="", subnet=org.wired_subnets[0].idx, in_inventory=False)
    org.devices.append(nd)
    plan.presence[nd.idx] = [Seg(t0, E, nd.subnet)]
    inc.append(Incident("new_device", nd, t0, E))

    # malware retrying its command-and-control server, which refuses every connection
    t0 = at(0.44)
    dur = min(RETRY_WINDOW, max(MIN, W // 10))
    d = actor(clients)
    force_present(plan, d, t0 - MIN, t0 + dur + MIN)
    inc.append(Incident("c2_retry", d, t0, t0 + dur))

    # a forgotten server with a static address (no DHCP, not in the inventory) exploited from outside;
    # not in org.devices: it has no lease and no traffic of its own
    t0 = at(0.92)
    wired = org.wired_subnets[0]
    nas = Device(idx=-1, mac="00:11:32:" + ":".join(f"{rng.randrange(256):02x}" for _ in range(3)),
                 hostname="nas-old", owner="", owner_email="", department="", device_type="server",
                 os="Synology DSM", first_seen="", subnet=wired.idx, reserved_ip=f"{wired.prefix}.{STATIC_HOST}",
                 in_inventory=False)
    inc.append(Incident("exploit_static_host", nas, t0, t0 + MIN))
    return inc, spoofed


def _name(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(alphabet[rng.randrange(len(alphabet))] for _ in range(n))


def emit_scenarios(org: Org, plan: Plan, incidents: list[Incident], sink: Sink, seed: int,
                   window: int = 0) -> None:
    """Write every incident's traffic into ``sink`` and fill its ids, times and details."""
    rng = random.Random(f"{seed}:scenario-events:{window}")
    tr = Traffic(org, sink, rng)
    for inc in incidents:
        tr.cache = {}
        tr.track = inc.ids
        d = inc.dev
        s = inc.scenario
        if s == "dns_tunneling":
            domain = f"{_word(rng, org)}{rng.randrange(10, 99)}.{rng.choice(('xyz', 'top', 'info'))}"
            ip = plan.ip_at(d.idx, inc.start)
            t = inc.start
            n = 0
            while t < inc.end:
                qtype = "TXT" if rng.random() < 0.65 else "NULL"
                qname = (f"{_name(rng, HEX, rng.randint(*TUNNEL_LABEL))}."
                         f"{_name(rng, HEX, rng.randint(20, 40))}.{domain}")
                payload = _name(rng, HEX, rng.randint(80, 200))
                tr.query(t, ip, qname, qtype, "NOERROR", [(qname, qtype, payload, 0)],
                         rtt=rng.randrange(20_000, 120_000))
                n += 1
                t += TUNNEL_INTERVAL + rng.randrange(-US, US)
            inc.host_ip = ip
            inc.details = {"domain": domain, "queries": n, "qtypes": ["TXT", "NULL"],
                           "interval_s": 5, "first_label_len": list(TUNNEL_LABEL)}
        elif s == "dns_exfiltration":
            apex = (f"{_word(rng, org)}-{rng.choice(('sync', 'cdn', 'metrics', 'telemetry'))}"
                    f".{rng.choice(('com', 'net', 'io'))}")
            ip = plan.ip_at(d.idx, inc.start)
            session = _name(rng, HEX, 6)
            answer = org.ext_pool[rng.randrange(len(org.ext_pool))]
            times = sorted(inc.start + rng.randrange(inc.end - inc.start) for _ in range(EXFIL_QUERIES))
            total = 0
            for i, t in enumerate(times):
                qname = (f"{_name(rng, B32, rng.randint(*EXFIL_LABELS))}.{_name(rng, B32, rng.randint(*EXFIL_LABELS))}"
                         f".{session}-{i:x}.{apex}")
                total += len(qname)
                tr.query(t, ip, qname, "A", "NOERROR", [(qname, "A", answer, 1)], rtt=rng.randrange(25_000, 150_000))
            inc.host_ip = ip
            inc.start, inc.end = times[0], times[-1]
            inc.details = {"apex": apex, "queries": EXFIL_QUERIES, "qname_bytes": total,
                           "window_s": (times[-1] - times[0]) // US, "label_len": list(EXFIL_LABELS)}
        elif s == "dga":
            ip = plan.ip_at(d.idx, inc.start)
            tlds = ("com", "net", "org", "info", "biz", "xyz", "top")
            nx = 0
            resolved = None
            last = inc.start
            for b, t0 in enumerate(inc.extra["bursts"]):
                ts = sorted(t0 + rng.randrange(DGA_BURST_LEN) for _ in range(DGA_PER_BURST))
                for k, t in enumerate(ts):
                    name = f"{_name(rng, string.ascii_lowercase, rng.randint(10, 18))}.{rng.choice(tlds)}"
                    if b == len(inc.extra["bursts"]) - 1 and k == DGA_PER_BURST - 1:
                        resolved = (name, org.ext_pool[rng.randrange(len(org.ext_pool))])
                        done = tr.query(t, ip, name, "A", "NOERROR", [(name, "A", resolved[1], 300)],
                                        rtt=rng.randrange(20_000, 90_000))
                        tr.web(done + 5_000, ip, resolved[1], 443)
                    else:
                        tr.query(t, ip, name, "A", "NXDOMAIN", [], rtt=rng.randrange(10_000, 80_000))
                        nx += 1
                    last = max(last, t)
            inc.host_ip = ip
            inc.end = last
            inc.details = {"bursts": len(inc.extra["bursts"]), "queries_per_burst": DGA_PER_BURST,
                           "burst_seconds": DGA_BURST_LEN // US, "nxdomain": nx,
                           "resolved_domain": resolved[0] if resolved else None}
        elif s == "port_scan":
            ip = plan.ip_at(d.idx, inc.start)
            wired = org.wired_subnets[0]
            targets = [f"{wired.prefix}.{i}" for i in range(10, 10 + SCAN_HOSTS + 1) if f"{wired.prefix}.{i}" != ip]
            targets = targets[:SCAN_HOSTS]
            owner_type = {x.reserved_ip: x.device_type for x in org.devices if x.reserved_ip}
            by_mac = {x.mac: x.device_type for x in org.devices}
            probes = [(inc.start + rng.randrange(inc.end - inc.start), h, p) for h in targets for p in SCAN_PORTS]
            probes.sort()
            sport = rng.randrange(40000, 60000)
            next_alert = inc.start
            states = {"REJ": 0, "S0": 0, "RSTO": 0}
            from .timeline import owner_at
            for t, h, p in probes:
                mac = owner_at(plan, h, t)
                dtype = owner_type.get(h) or (by_mac.get(mac) if mac else None)
                if dtype is None or dtype == "desktop":      # nobody there, or host firewall drops
                    uid, fid, cid = sink.conn_flow(t, ip, sport, h, p, TCP, None, None, None, None, None,
                                                   "S0", "S", 1, 44, 0, 0)
                    states["S0"] += 1
                elif p in OPEN_PORTS.get(dtype, set()):
                    uid, fid, cid = sink.conn_flow(t, ip, sport, h, p, TCP, None, None, rng.randrange(200, 3_000),
                                                   0, 0, "RSTO", "ShR", 2, 84, 1, 44)
                    states["RSTO"] += 1
                else:
                    uid, fid, cid = sink.conn_flow(t, ip, sport, h, p, TCP, None, None, rng.randrange(150, 2_000),
                                                   0, 0, "REJ", "Sr", 1, 44, 1, 40)
                    states["REJ"] += 1
                inc.ids += [uid, str(fid)]
                if t >= next_alert:
                    sig = SIG_SSH_SCAN if p == 22 else SIG_SCAN
                    sink.alert(t + 50, t, ip, sport, h, p, TCP, fid, cid, sig, None, (1, 0, 60, 0))
                    next_alert = t + 60 * US
            inc.host_ip = ip
            inc.start, inc.end = probes[0][0], probes[-1][0]
            inc.details = {"targets": len(targets), "ports": len(SCAN_PORTS), "probes": len(probes),
                           "window_s": (inc.end - inc.start) // US, "conn_states": states,
                           "alert_signature_id": SIG_SCAN[0]}
        elif s == "c2_beaconing":
            domain = f"{_word(rng, org)}-{_word(rng, org)}.com"
            c2 = org.ext_pool[rng.randrange(len(org.ext_pool))]
            t = inc.start
            n = 0
            ip = plan.ip_at(d.idx, t)
            expires = 0
            used: set[int] = set()  # an OS hands out ephemeral ports in turn: a beacon's never repeat in minutes
            while t < inc.end:
                ipt = plan.ip_at(d.idx, t) or ip
                if t >= expires:
                    tr.query(t - rng.randrange(20_000, 60_000), ipt, domain, "A", "NOERROR", [(domain, "A", c2, 300)],
                             rtt=rng.randrange(15_000, 60_000))
                    expires = t + 300 * US
                big = rng.random() < 0.07
                sport = rng.randrange(49152, 65535)
                while sport in used:  # a repeat would share its 5-tuple, so its community_id, with another
                    sport = 49152 + (sport - 49152 + 1) % (65535 - 49152)
                used.add(sport)
                uid, fid, _ = sink.tcp(t, ipt, sport, c2, 443, "ssl", "tls", rng.randrange(150_000, 600_000),
                                       420 + rng.randrange(-30, 30),
                                       rng.randrange(4_000, 12_000) if big else 250 + rng.randrange(-20, 20))
                inc.ids += [uid, str(fid)]
                n += 1
                last = t
                t += BEACON_INTERVAL + rng.randrange(-BEACON_JITTER, BEACON_JITTER + 1)
            inc.host_ip = ip
            inc.end = last
            inc.details = {"domain": domain, "c2_ip": c2, "c2_port": 443, "connections": n,
                           "interval_s": 60, "jitter_s": 3}
        elif s == "ids_alert_reused_ip":
            t = inc.start
            h = plan.holding_at(d.idx, t)
            ip = h.ip
            bad = org.ext_pool[rng.randrange(len(org.ext_pool))]
            domain = f"{_word(rng, org)}{_word(rng, org)}.top"
            done = tr.query(t, ip, domain, "A", "NOERROR", [(domain, "A", bad, 300)], rtt=rng.randrange(20_000, 60_000))
            sport = rng.randrange(49152, 65535)
            ts = done + 3_000
            ob, rb = 612, 289
            uid, fid, cid = sink.tcp(ts, ip, sport, bad, 80, "http", "http", 420_000, ob, rb, alerted=True)
            inc.ids += [uid, str(fid)]
            sink.alert(ts + 95_000, ts, ip, sport, bad, 80, TCP, fid, cid, SIG_MALWARE, "http",
                       (4, 3, ob + 66 * 4, 400))
            b: Device = inc.extra["b"]
            hb = plan.holding_at(b.idx, inc.extra["t_b"] + 60 * US)
            inc.host_ip = ip
            inc.start, inc.end = ts, ts + 420_000
            inc.details = {"alert_time": iso(ts + 95_000), "signature_id": SIG_MALWARE[0],
                           "signature": SIG_MALWARE[2], "severity": SIG_MALWARE[4],
                           "lease_holder_at_alert": d.mac,
                           "ip_later_held_by": b.mac if hb and hb.ip == ip else None,
                           "ip_later_held_by_hostname": b.hostname if hb and hb.ip == ip else None,
                           "reassigned_at": iso(hb.start) if hb and hb.ip == ip else None,
                           "remote_ip": bad, "domain": domain}
        elif s == "dhcp_starvation":
            inc.host_ip = plan.ip_at(d.idx, inc.start)
        elif s == "roaming_laptop":
            hs = plan.holdings.get(d.idx, [])
            inc.host_ip = hs[0].ip if hs else None
            inc.start = hs[0].start if hs else inc.start
            inc.details = {"leases": [{"ip": h.ip, "subnet": org.subnets[h.subnet].name, "start": iso(h.start),
                                       "end": iso(h.end)} for h in hs],
                           "distinct_ips": len({h.ip for h in hs})}
        elif s == "new_device":
            hs = plan.holdings.get(d.idx, [])
            if hs:
                h = hs[0]
                ip = h.ip
                inc.host_ip = ip
                inc.start = h.start
                t = h.start + rng.randrange(2 * US, 20 * US)
                for name, port in (("deb.debian.org", 80), ("archive.raspberrypi.org", 80)):
                    done, ips = tr.resolve(t, ip, name)
                    if ips:
                        tr.web(done + 2_000, ip, ips[0], port, big=True)
                    t += rng.randrange(US, 5 * US)
                ssh = org.ext_pool[rng.randrange(len(org.ext_pool))]
                while t < h.end:
                    sport = rng.randrange(32768, 60999)
                    uid, fid, _ = sink.tcp(t, ip, sport, ssh, 22, "ssh", "ssh",
                                           rng.randrange(5 * US, 600 * US), rng.randrange(3_000, 60_000),
                                           rng.randrange(3_000, 90_000))
                    inc.ids += [uid, str(fid)]
                    site = org.pick_site(rng.random())
                    done, ips = tr.resolve(t + rng.randrange(MIN), ip, site.primary)
                    if ips:
                        tr.web(done + 2_000, ip, ips[0])
                    t += rng.randrange(8 * MIN, 20 * MIN)
                inc.details = {"hostname": d.hostname, "vendor": "Raspberry Pi Trading", "ssh_remote": ssh,
                               "first_dhcp": iso(h.start)}
        elif s == "c2_retry":
            ip = plan.ip_at(d.idx, inc.start)
            c2 = org.ext_pool[rng.randrange(len(org.ext_pool))]
            port = rng.choice(RETRY_PORTS)
            step = (inc.end - inc.start) // RETRY_ATTEMPTS
            times = [inc.start + k * step + rng.randrange(-min(2 * US, step // 2), min(2 * US, step // 2) + 1)
                     for k in range(RETRY_ATTEMPTS)]
            for t in times:
                uid, fid, _ = sink.conn_flow(t, ip, rng.randrange(49152, 65535), c2, port, TCP, None, None,
                                             rng.randrange(150, 2_000), 0, 0, "REJ", "Sr", 1, 44, 1, 40)
                inc.ids += [uid, str(fid)]
            inc.host_ip = ip
            inc.start, inc.end = min(times), max(times)
            inc.details = {"c2_ip": c2, "c2_port": port, "attempts": RETRY_ATTEMPTS, "conn_state": "REJ",
                           "window_s": (inc.end - inc.start) // US}
        elif s == "exploit_static_host":
            ip = d.reserved_ip
            attacker = org.ext_pool[rng.randrange(len(org.ext_pool))]
            times = sorted(inc.start + rng.randrange(60 * US) for _ in range(EXPLOIT_ATTEMPTS))
            for t in times:
                sport = rng.randrange(32768, 60999)
                ob, rb = rng.randrange(400, 900), rng.randrange(150, 600)
                uid, fid, cid = sink.tcp(t, attacker, sport, ip, 8080, "http", "http", rng.randrange(20_000, 200_000),
                                         ob, rb, alerted=True)
                inc.ids += [uid, str(fid)]
                sink.alert(t + 4_000, t, attacker, sport, ip, 8080, TCP, fid, cid, SIG_EXPLOIT, "http",
                           (3, 2, ob + 66 * 3, 200))
            inc.host_ip = ip
            inc.start, inc.end = times[0], times[-1] + 4_000
            inc.details = {"attacker_ip": attacker, "port": 8080, "attempts": EXPLOIT_ATTEMPTS,
                           "signature_id": SIG_EXPLOIT[0], "signature": SIG_EXPLOIT[2], "severity": SIG_EXPLOIT[4],
                           "static_address": True}
        tr.track = None
