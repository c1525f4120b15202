"""Normal traffic: what every device does in one hour while it holds an address.

Per device and hour the volume is Poisson with mean ``rate(type) x activity(device) x
diurnal(hour of day) x (fraction of the hour online)``. A *visit* is a page load: DNS for the
site and some of its third-party hosts (skipped while the device's cache still holds the
answer), then 1-3 TLS (sometimes HTTP or QUIC) connections per host. Around that: Windows
telemetry, Apple background services, NTP, Kerberos/LDAP/SMB to the servers, phone push
channels, IoT cloud check-ins every 300 s, printers idle, plus benign noise that detection
rules must tolerate: Chrome's random single-label probes (NXDOMAIN), WPAD lookups, typos,
PTR lookups, the odd failed connection and low-severity IDS alerts.
"""
from __future__ import annotations

import math
import random

from .community_id import TCP, UDP
from .org import APPLE_BG, IOT_CLOUDS, NTP_SERVERS, PUSH, RESOLVERS, TELEMETRY, Device, DomainInfo, Org, apex_of
from .sensors import Sink

US = 1_000_000
HOUR = 3600 * US

VISITS_PER_HOUR = {"laptop": 9.0, "desktop": 8.0, "phone": 4.0, "server": 0.6, "printer": 0.0, "iot": 0.0}
# activity by hour of day (UTC; the organisation works on UTC)
DIURNAL = (0.12, 0.1, 0.1, 0.1, 0.1, 0.15, 0.3, 0.6, 0.9, 1.0, 1.0, 0.95,
           0.7, 0.9, 1.0, 1.0, 0.9, 0.7, 0.45, 0.35, 0.3, 0.25, 0.2, 0.15)

BENIGN_SIGNATURES = (
    (2210045, 2, "SURICATA STREAM Packet with invalid ack", "Generic Protocol Command Decode", 3),
    (2210029, 2, "SURICATA STREAM ESTABLISHED invalid ack", "Generic Protocol Command Decode", 3),
    (2027695, 3, "ET POLICY Observed Cloudflare DNS over HTTPS Domain (cloudflare-dns .com in TLS SNI)",
     "Potential Corporate Privacy Violation", 2),
    (2012648, 5, "ET POLICY Dropbox Client Broadcasting", "Potential Corporate Privacy Violation", 2),
    (2033966, 2, "ET INFO Microsoft Connection Test", "Misc activity", 3),
)
BENIGN_HTTP = BENIGN_SIGNATURES[:2] + (
    (2221010, 1, "SURICATA HTTP unable to match response to request", "Generic Protocol Command Decode", 3),
    (2013504, 6, "ET POLICY GNU/Linux APT User-Agent Outbound likely related to package management",
     "Not Suspicious Traffic", 3),
)


def poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, int(rng.gauss(lam, math.sqrt(lam)) + 0.5))
    L = math.exp(-lam)
    k = 0
    p = rng.random()
    while p > L:
        k += 1
        p *= rng.random()
    return k


def answers_for(info: DomainInfo, qtype: str, rng: random.Random) -> list[tuple[str, str, str, int]]:
    out: list[tuple[str, str, str, int]] = []
    owner = info.name
    if info.cname and qtype in ("A", "AAAA"):
        out.append((owner, "CNAME", info.cname, info.ttl))
        owner = info.cname
    ttl = max(1, info.ttl - int(rng.random() * info.ttl)) if info.ttl > 20 else info.ttl
    if qtype == "A":
        out.extend((owner, "A", ip, ttl) for ip in info.ips)
    elif qtype == "AAAA":
        out.extend((owner, "AAAA", ip, ttl) for ip in info.ipv6)
    return out


class Traffic:
    """Emits normal traffic into a :class:`Sink`; also used by scenarios for their cover
    traffic and lookups. ``ids`` collects the (uid, flow_id) of everything emitted while
    ``track`` is set, so ground truth can list a device's events."""

    def __init__(self, org: Org, sink: Sink, rng: random.Random):
        self.org = org
        self.sink = sink
        self.rng = rng
        rnd = rng.random

        def ri(a: int, b: int | None = None) -> int:
            """Uniform integer in [a, b) (or [0, a)); cheaper than Random.randrange."""
            if b is None:
                return int(rnd() * a)
            return a + int(rnd() * (b - a))

        self.ri = ri
        self.cache: dict[str, int] = {}
        self.track: list | None = None
        self.alert_rate = 0.0015

    def _ids(self, uid: str, fid: int) -> None:
        if self.track is not None:
            self.track.append(uid)
            self.track.append(str(fid))

    # DNS -------------------------------------------------------------------------------------
    def resolver(self) -> str:
        return RESOLVERS[0] if self.rng.random() < 0.9 else RESOLVERS[1]

    def query(self, t: int, ip: str, qname: str, qtype: str, rcode: str,
              answers: list[tuple[str, str, str, int]], rtt: int | None = None,
              resolver: str | None = None) -> int:
        rng = self.rng
        if rtt is None:
            rtt = self.ri(200, 2_500) if rng.random() < 0.7 else self.ri(8_000, 90_000)
        uid, fid = self.sink.dns(t, ip, resolver or self.resolver(), qname, qtype, rcode, answers, rtt,
                                 apex=apex_of(qname) if rcode == "NXDOMAIN" and "." in qname else None)
        self._ids(uid, fid)
        return t + rtt

    def resolve(self, t: int, ip: str, name: str, dev: Device | None = None) -> tuple[int, tuple[str, ...]]:
        """Look ``name`` up unless cached; returns (time answer arrives, IPv4 addresses)."""
        org = self.org
        info = org.domains.get(name)
        if info is None:
            internal = org.internal_names.get(name)
            if internal is None:
                return self.query(t, ip, name, "A", "NXDOMAIN", []), ()
            if self.cache.get(name, 0) > t:
                return t, (internal,)
            self.cache[name] = t + 1200 * US
            return self.query(t, ip, name, "A", "NOERROR", [(name, "A", internal, 1200)],
                              rtt=self.ri(150, 900)), (internal,)
        if self.cache.get(name, 0) > t:
            return t, info.ips
        rng = self.rng
        self.cache[name] = t + info.ttl * US
        done = self.query(t, ip, name, "A", "NOERROR", answers_for(info, "A", rng))
        if dev is not None and dev.device_type != "iot" and rng.random() < 0.55:
            done = max(done, self.query(t + self.ri(50, 900), ip, name, "AAAA", "NOERROR",
                                        answers_for(info, "AAAA", rng)))
        if dev is not None and dev.family in ("macOS", "iOS") and rng.random() < 0.4:
            self.query(t + self.ri(50, 900), ip, name, "HTTPS", "NOERROR", [])
        return done, info.ips

    # connections -----------------------------------------------------------------------------
    def web(self, t: int, ip: str, dst: str, port: int = 443, big: bool = False) -> None:
        rng = self.rng
        sport = self.ri(49152, 65535)
        r = rng.random()
        if r < 0.006:   # unreachable: SYN, retransmitted, no answer
            uid, fid, _ = self.sink.conn_flow(t, ip, sport, dst, port, TCP, None, None, 3 * US, 0, 0,
                                              "S0", "S", 2, 104, 0, 0)
            self._ids(uid, fid)
            return
        if r < 0.009:
            uid, fid, _ = self.sink.conn_flow(t, ip, sport, dst, port, TCP, None, None,
                                              self.ri(300, 40_000), 0, 0, "REJ", "Sr", 1, 52, 1, 40)
            self._ids(uid, fid)
            return
        ob = int(min(2e6, rng.lognormvariate(6.9, 0.9)))
        rb = int(min(4e7, rng.lognormvariate(9.0 if not big else 12.0, 1.5)))
        dur = int(min(1500 * US, rng.lognormvariate(13.5, 1.6)))
        state, hist = ("SF", "ShADadFf") if r < 0.93 else (("RSTO", "ShADadR") if r < 0.965 else ("RSTR", "ShADadr"))
        service, app = (("ssl", "tls") if port in (443, 8443, 5223, 5228)
                        else ("http", "http") if port == 80 else (None, "failed"))
        alerted = rng.random() < self.alert_rate
        uid, fid, cid = self.sink.tcp(t, ip, sport, dst, port, service, app, dur, ob, rb, state, hist, alerted)
        self._ids(uid, fid)
        if alerted:
            sigs = BENIGN_HTTP if port == 80 else BENIGN_SIGNATURES
            sig = sigs[self.ri(len(sigs))]
            opk = 3 + ob // 1200 + 1
            self.sink.alert(t + self.ri(1_000, max(2_000, dur)), t, ip, sport, dst, port, TCP, fid, cid,
                            sig, app, (opk, 3, ob + 66 * opk, 200))

    def quic(self, t: int, ip: str, dst: str) -> None:
        rng = self.rng
        sport = self.ri(49152, 65535)
        ob = int(rng.lognormvariate(8.3, 0.8))
        rb = int(rng.lognormvariate(10.0, 1.4))
        opk, rpk = 4 + ob // 1200, 3 + rb // 1250
        dur = int(min(600 * US, rng.lognormvariate(13.0, 1.3)))
        uid, fid, _ = self.sink.conn_flow(t, ip, sport, dst, 443, UDP, "ssl,quic", "quic", dur, ob, rb,
                                          "SF", "Dd", opk, ob + 28 * opk, rpk, rb + 28 * rpk)
        self._ids(uid, fid)

    def internal(self, t: int, ip: str, dst: str, port: int, service: str) -> None:
        rng = self.rng
        sport = self.ri(49152, 65535)
        ob = int(rng.lognormvariate(7.0, 1.0))
        rb = int(rng.lognormvariate(8.0 if port != 445 else 11.0, 1.3))
        dur = int(min(900 * US, rng.lognormvariate(11.5, 1.8)))
        app = {"krb_tcp": "krb5", "ldap_tcp": "ldap", "smb": "smb", "ssl": "tls"}.get(service)
        uid, fid, _ = self.sink.tcp(t, ip, sport, dst, port, service, app, dur, ob, rb)
        self._ids(uid, fid)

    # the hour ------------------------------------------------------------------------------
    def visit(self, t: int, dev: Device, ip: str) -> None:
        rng = self.rng
        org = self.org
        site = org.pick_site(rng.random())
        names = [site.primary] + [d for d in site.deps if rng.random() < 0.6]
        tt = t
        for name in names:
            done, ips = self.resolve(tt, ip, name, dev)
            if rng.random() < 0.01:   # a typo on the way
                typo = name.replace(".", "", 1) if name.count(".") > 1 else "w" + name
                self.query(tt + self.ri(1_000, 500_000), ip, typo, "A", "NXDOMAIN", [])
            if ips:
                n = 1 + (rng.random() < 0.45) + (rng.random() < 0.15)
                for _ in range(n):
                    dst = ips[self.ri(len(ips))]
                    ts = done + self.ri(1_000, 400_000)
                    if "google" in name or "youtube" in name or "gstatic" in name:
                        if rng.random() < 0.5:
                            self.quic(ts, ip, dst)
                            continue
                    self.web(ts, ip, dst, 80 if rng.random() < 0.05 else 443, big="video" in name)
            tt += self.ri(5_000, 250_000)

    def device_hour(self, dev: Device, spans: list[tuple[int, int, str]], h0: int, hod: int) -> None:
        """All normal traffic of ``dev`` for the online ``spans`` [(from, to, ip)] of one hour."""
        rng = self.rng
        online = sum(b - a for a, b, _ in spans)
        if online <= 0:
            return
        frac = online / HOUR
        diurnal = DIURNAL[hod]
        t_ = dev.device_type
        fam = dev.family

        def when() -> tuple[int, str]:
            x = self.ri(online)
            for a, b, ip in spans:
                if x < b - a:
                    return a + x, ip
                x -= b - a
            a, b, ip = spans[-1]
            return a, ip

        for _ in range(poisson(rng, VISITS_PER_HOUR.get(t_, 0.0) * dev.activity * diurnal * frac)):
            t, ip = when()
            self.visit(t, dev, ip)
        if t_ in ("laptop", "desktop"):
            if fam == "Windows":
                for _ in range(poisson(rng, 2.0 * frac * max(diurnal, 0.3))):
                    t, ip = when()
                    name = TELEMETRY[self.ri(len(TELEMETRY))]
                    done, ips = self.resolve(t, ip, name, dev)
                    if ips:
                        self.web(done + self.ri(1_000, 50_000), ip, ips[0])
                for _ in range(poisson(rng, 2.5 * frac * max(diurnal, 0.2))):
                    t, ip = when()
                    self.corp(t, ip)
                if rng.random() < 0.15 * frac:
                    t, ip = when()
                    self.query(t, ip, f"wpad.{self.org.zone}", "A", "NXDOMAIN", [])
            if rng.random() < 0.12 * frac:   # browser start: Chrome's three intranet-redirect probes
                t, ip = when()
                for _ in range(3):
                    label = "".join(chr(97 + self.ri(26)) for _ in range(self.ri(7, 16)))
                    self.query(t + self.ri(0, 80_000), ip, label, "A", "NXDOMAIN", [])
        if fam in ("macOS", "iOS"):
            for _ in range(poisson(rng, 1.5 * frac)):
                t, ip = when()
                name = APPLE_BG[self.ri(len(APPLE_BG))]
                done, ips = self.resolve(t, ip, name, dev)
                if ips:
                    self.web(done + 5_000, ip, ips[0])
        if t_ == "phone":
            name, port = PUSH.get(fam, PUSH["Android"])
            for _ in range(poisson(rng, 0.8 * frac)):
                t, ip = when()
                done, ips = self.resolve(t, ip, name, dev)
                if ips:
                    sport = self.ri(49152, 65535)
                    dur = self.ri(300 * US, 1500 * US)
                    uid, fid, _ = self.sink.tcp(done + 3_000, ip, sport, ips[0], port, "ssl", "tls", dur,
                                                self.ri(2_000, 9_000), self.ri(3_000, 20_000))
                    self._ids(uid, fid)
        if t_ == "iot":
            cloud = IOT_CLOUDS.get(dev.mac[:8], "pool.ntp.org")
            period = 300 * US
            for a, b, ip in spans:
                k = -(-(a - dev.phase) // period)
                t = dev.phase + k * period
                while t < b:
                    tj = t + self.ri(-US, US)
                    if a <= tj < b:
                        done, ips = self.resolve(tj, ip, cloud, dev)
                        if ips:
                            sport = self.ri(49152, 65535)
                            uid, fid, _ = self.sink.tcp(done + 2_000, ip, sport, ips[0], 443, "ssl", "tls",
                                                        self.ri(150_000, 400_000),
                                                        self.ri(600, 700), self.ri(1_400, 1_600))
                            self._ids(uid, fid)
                    t += period
        if t_ == "server":
            for _ in range(poisson(rng, 0.4 * frac)):
                t, ip = when()
                name = ("security.ubuntu.com" if "Ubuntu" in dev.os or "Debian" in dev.os
                        else "packages.microsoft.com")
                done, ips = self.resolve(t, ip, name, dev)
                if ips:
                    self.web(done + 2_000, ip, ips[0], 80 if "ubuntu" in name else 443, big=True)
        # NTP
        if rng.random() < 0.6 * frac:
            t, ip = when()
            name = NTP_SERVERS.get(fam, NTP_SERVERS["other"])
            done, ips = self.resolve(t, ip, name, dev)
            if ips:
                sport = 123 if fam not in ("Windows", "macOS", "iOS") else self.ri(49152, 65535)
                uid, fid, _ = self.sink.conn_flow(done + 1_000, ip, sport, ips[0], 123, UDP, "ntp", None,
                                                  self.ri(5_000, 80_000), 48, 48, "SF", "Dd", 1, 76, 1, 76)
                self._ids(uid, fid)
        if rng.random() < 0.2 * frac and t_ in ("laptop", "desktop", "server"):
            t, ip = when()
            other = self.org.devices[self.ri(len(self.org.devices))]
            if other.reserved_ip:
                rev = ".".join(reversed(other.reserved_ip.split("."))) + ".in-addr.arpa"
                self.query(t, ip, rev, "PTR", "NOERROR", [(rev, "PTR", f"{other.hostname}.{self.org.zone}", 1200)],
                           rtt=self.ri(150, 900))

    def corp(self, t: int, ip: str) -> None:
        """Windows domain traffic: Kerberos, LDAP, SMB, intranet."""
        rng = self.rng
        org = self.org
        r = rng.random()
        dc = org.server("dc01")
        if dc is None or not dc.reserved_ip:
            return
        if r < 0.3:
            if rng.random() < 0.3:
                srv = f"_ldap._tcp.dc._msdcs.{org.zone}"
                self.query(t, ip, srv, "SRV", "NOERROR", [(srv, "SRV", f"{dc.hostname}.{org.zone}", 600)],
                           rtt=self.ri(150, 900))
            self.internal(t + 2_000, ip, dc.reserved_ip, 88, "krb_tcp")
        elif r < 0.55:
            self.internal(t, ip, dc.reserved_ip, 389, "ldap_tcp")
        elif r < 0.85:
            done, ips = self.resolve(t, ip, f"files.{org.zone}")
            if ips:
                self.internal(done + 1_000, ip, ips[0], 445, "smb")
        else:
            done, ips = self.resolve(t, ip, f"intranet.{org.zone}")
            if ips:
                self.internal(done + 1_000, ip, ips[0], 443, "ssl")
