"""Who is on the network when, and with which address.

1. :func:`plan_presence` gives every device its on-network segments for the window:
   servers, printers and IoT always; desktops office hours (some never switch off);
   laptops arrive, go to lunch, walk to a meeting in the other building (another Wi-Fi
   subnet, so a new address), go home; phones drop off Wi-Fi now and then. Weekends are quiet.
2. Scenarios edit those segments (force an actor online, script a roaming laptop, ...).
3. :func:`simulate_dhcp` replays every join and leave in time order against one DHCP
   server (10.0.0.1) with per-subnet pools: renewals at T1 = lease/2, optional RELEASE on
   leave, otherwise the address stays bound until the lease expires. A client gets back its
   previous address while that is free, else the lowest free one, so addresses change
   hands over the day. The result is each device's *holdings* (ip, from, to) and the DHCP
   transactions the sensors see.
"""
from __future__ import annotations

import bisect
import heapq
import random
from dataclasses import dataclass, field

from .org import Device, Org, Subnet

US = 1_000_000
HOUR = 3600 * US
DAY = 24 * HOUR
INF = 1 << 62


@dataclass
class Seg:
    start: int
    end: int
    subnet: int
    pre: bool = False                # already online (with a lease) before the window starts
    release: bool = False            # sends DHCPRELEASE when leaving
    take_ip_of: int | None = None    # device idx whose released address this join must get
    reserve_for: int | None = None   # on RELEASE, hold the address for this device idx


@dataclass
class Holding:
    start: int
    end: int
    ip: str
    subnet: int


@dataclass
class DhcpTx:
    ts: int
    kind: str                 # dora, reboot, renew, release, offer, discover
    mac: str
    subnet: int
    ip: str | None
    hostname: str | None
    fqdn: str | None
    lease_time: int
    duration: int
    dev: int | None           # device idx, None for spoofed MACs
    tag: str | None = None    # scenario tag (e.g. "dhcp_starvation")


@dataclass
class Plan:
    start: int
    end: int
    presence: dict[int, list[Seg]]
    holdings: dict[int, list[Holding]] = field(default_factory=dict)
    dhcp: list[DhcpTx] = field(default_factory=list)
    ip_owners: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)  # ip -> (from, to, mac)

    def ip_at(self, dev: int, t: int) -> str | None:
        for h in self.holdings.get(dev, ()):
            if h.start <= t < h.end:
                return h.ip
        return None

    def holding_at(self, dev: int, t: int) -> Holding | None:
        for h in self.holdings.get(dev, ()):
            if h.start <= t < h.end:
                return h
        return None


def _g(rng: random.Random, mu_h: float, sd_h: float) -> int:
    return int(rng.gauss(mu_h, sd_h) * HOUR)


def _day_segments(dev: Device, day0: int, weekend: bool, rng: random.Random, org: Org) -> list[Seg]:
    t = dev.device_type
    home = dev.subnet
    if t == "desktop":
        if weekend and rng.random() > 0.05:
            return []
        return [Seg(day0 + _g(rng, 8.3, 0.5), day0 + _g(rng, 17.8, 0.7), home,
                    release=rng.random() < 0.1)]
    if t in ("laptop", "phone"):
        if (weekend and rng.random() > 0.08) or (not weekend and rng.random() < 0.08):
            return []
        a = day0 + _g(rng, 8.7, 0.7)
        b = day0 + _g(rng, 17.4, 0.8)
        if b <= a + HOUR:
            b = a + 2 * HOUR
        cuts: list[tuple[int, int, int]] = []   # (from, to, subnet) with -1 = offline
        if t == "laptop":
            if rng.random() < 0.5:
                g0 = day0 + 12 * HOUR + rng.randrange(HOUR)
                cuts.append((g0, g0 + rng.randrange(20 * 60 * US, 60 * 60 * US), -1))
            wifi = [s.idx for s in org.wifi_subnets if s.idx != home]
            if wifi and rng.random() < 0.35 and b - a > 4 * HOUR:
                m0 = a + HOUR + rng.randrange(b - a - 3 * HOUR)
                cuts.append((m0, m0 + rng.randrange(45 * 60 * US, 90 * 60 * US), rng.choice(wifi)))
        else:
            for _ in range(rng.randrange(1, 4)):
                g0 = a + rng.randrange(max(1, b - a - HOUR))
                cuts.append((g0, g0 + rng.randrange(5 * 60 * US, 30 * 60 * US), -1))
        segs: list[Seg] = []
        cur = a
        for c0, c1, sub in sorted(cuts):
            c0 = max(c0, cur)
            if c0 >= b or c1 <= c0:
                continue
            if c0 > cur:
                segs.append(Seg(cur, c0, home))
            if sub >= 0:
                segs.append(Seg(c0, min(c1, b), sub))
            cur = min(c1, b)
        if cur < b:
            segs.append(Seg(cur, b, home, release=(t == "laptop" and rng.random() < 0.2)))
        return segs
    return []


def plan_presence(org: Org, start: int, end: int, seed: int, window: int = 0) -> Plan:
    """Every device's on-network segments inside [start, end)."""
    presence: dict[int, list[Seg]] = {}
    first_day = (start // DAY) * DAY - DAY
    for dev in org.devices:
        rng = random.Random(f"{seed}:presence:{window}:{dev.idx}")
        always = dev.device_type in ("server", "printer", "iot") or (
            dev.device_type == "desktop" and rng.random() < 0.3)
        if always:
            presence[dev.idx] = [Seg(start, end, dev.subnet, pre=True)]
            continue
        segs: list[Seg] = []
        day = first_day
        while day < end:
            dow = (day // DAY + 3) % 7          # 1970-01-01 was a Thursday; 5,6 = Sat,Sun
            segs.extend(_day_segments(dev, day, dow >= 5, rng, org))
            day += DAY
        presence[dev.idx] = clip(segs, start, end)
    return Plan(start=start, end=end, presence=presence)


def clip(segs: list[Seg], start: int, end: int) -> list[Seg]:
    out = []
    for s in sorted(segs, key=lambda s: s.start):
        if s.end <= start or s.start >= end:
            continue
        if s.start < start:
            s.start, s.pre = start, True
        if s.end > end:
            s.end = end
        if out and s.start < out[-1].end:
            if s.subnet == out[-1].subnet:
                out[-1].end = max(out[-1].end, s.end)
                continue
            out[-1].end = s.start
            if out[-1].end <= out[-1].start:
                out.pop()
        out.append(s)
    return out


def force_present(plan: Plan, dev: Device, t0: int, t1: int) -> None:
    """Make sure ``dev`` is online (in one segment) for all of [t0, t1]."""
    t0 = max(t0, plan.start)
    t1 = min(t1, plan.end)
    segs = plan.presence.setdefault(dev.idx, [])
    for s in segs:
        if s.start <= t0 and s.end >= t1:
            return
    sub = dev.subnet
    for s in segs:
        if s.start < t1 and s.end > t0:
            sub = s.subnet
            break
    keep = [s for s in segs if s.end <= t0 - 60 * US or s.start >= t1 + 60 * US]
    touching = [s for s in segs if s not in keep]
    lo = min([t0] + [s.start for s in touching])
    hi = max([t1] + [s.end for s in touching])
    pre = any(s.pre and s.start == lo for s in touching)
    keep.append(Seg(lo, hi, sub, pre=pre or lo <= plan.start))
    plan.presence[dev.idx] = clip(keep, plan.start, plan.end)


class _Pool:
    def __init__(self, subnet: Subnet, reserved: set[str]):
        self.subnet = subnet
        self.addrs = [f"{subnet.prefix}.{i}" for i in range(10, 255) if f"{subnet.prefix}.{i}" not in reserved]
        self.holder: dict[str, tuple[str, int]] = {}   # ip -> (mac, lease end; INF while in use)
        self.reserved_for: dict[str, str] = {}         # ip -> mac

    def free(self, ip: str, t: int, mac: str) -> bool:
        h = self.holder.get(ip)
        r = self.reserved_for.get(ip)
        if r is not None and r != mac:
            return False
        return h is None or h[0] == mac or h[1] <= t

    def lowest_free(self, t: int, mac: str) -> str | None:
        for ip in self.addrs:
            if self.free(ip, t, mac):
                return ip
        return None


def simulate_dhcp(org: Org, plan: Plan, seed: int, window: int = 0,
                  starvation: list[tuple[int, str, int, bool]] | None = None,
                  prev_ips: dict[str, str] | None = None) -> None:
    """Fill ``plan.holdings``, ``plan.dhcp`` and ``plan.ip_owners``.

    ``starvation`` = [(time, spoofed mac, subnet, completes DORA)].
    ``prev_ips`` = {mac: ip} held at the end of a previous window (live mode).
    """
    rng = random.Random(f"{seed}:dhcp:{window}")
    reserved = {d.reserved_ip for d in org.devices if d.reserved_ip}
    pools = {s.idx: _Pool(s, reserved) for s in org.subnets}
    devs = {d.idx: d for d in org.devices}
    last_ip: dict[tuple[str, int], str] = {}
    if prev_ips:
        for d in org.devices:
            ip = prev_ips.get(d.mac)
            if ip:
                for s in org.subnets:
                    if ip.startswith(s.prefix + "."):
                        last_ip[(d.mac, s.idx)] = ip
    # events: (time, order, seq, kind, payload)
    ev: list = []
    seq = 0
    for idx, segs in plan.presence.items():
        for k, s in enumerate(segs):
            ev.append((s.start, 1, seq, "join", (idx, k)))
            seq += 1
    for t, mac, sub, full in starvation or ():
        ev.append((t, 1, seq, "spoof", (mac, sub, full)))
        seq += 1
    heapq.heapify(ev)
    active: dict[tuple[int, int], tuple[str, int, int]] = {}   # (dev, seg) -> (ip, ack0, holding index)
    holdings: dict[int, list[Holding]] = {i: [] for i in plan.presence}
    txs: list[DhcpTx] = []
    owners: dict[str, list[tuple[int, int, str]]] = {}

    def fqdn(dev: Device) -> str | None:
        return f"{dev.hostname}.{org.zone}" if dev.os.startswith("Windows") else None

    while ev:
        t, _, _, kind, payload = heapq.heappop(ev)
        if kind == "spoof":
            mac, sub, full = payload
            pool = pools[sub]
            L = pool.subnet.lease_time
            ip = pool.lowest_free(t, mac)
            dur = rng.randrange(2_000, 40_000)
            if ip is None:
                txs.append(DhcpTx(t, "discover", mac, sub, None, None, None, L, 0, None, "dhcp_starvation"))
                continue
            if full:
                pool.holder[ip] = (mac, t + L * US)
                owners.setdefault(ip, []).append((t, t + L * US, mac))
                txs.append(DhcpTx(t, "dora", mac, sub, ip, None, None, L, dur, None, "dhcp_starvation"))
            else:
                pool.holder[ip] = (mac, t + 120 * US)   # an OFFER holds the address briefly
                txs.append(DhcpTx(t, "offer", mac, sub, ip, None, None, L, dur, None, "dhcp_starvation"))
            continue
        idx, k = payload
        dev = devs[idx]
        seg = plan.presence[idx][k]
        pool = pools[seg.subnet]
        L = pool.subnet.lease_time
        mac = dev.mac
        if kind == "join":
            prev = last_ip.get((mac, seg.subnet))
            own = pool.holder.get(prev) if prev else None
            valid_own = own is not None and own[0] == mac and own[1] > t
            if dev.reserved_ip and dev.reserved_ip.startswith(pool.subnet.prefix + "."):
                ip = dev.reserved_ip
                txkind = "reboot" if valid_own else "dora"
            elif seg.take_ip_of is not None:
                ip = last_ip.get((devs[seg.take_ip_of].mac, seg.subnet))
                txkind = "dora"
                if ip is None or not pool.free(ip, t, mac):
                    ip = pool.lowest_free(t, mac)
            elif valid_own:
                ip, txkind = prev, "reboot"
            elif prev and pool.free(prev, t, mac):
                ip, txkind = prev, "dora"
            else:
                ip, txkind = pool.lowest_free(t, mac), "dora"
            if ip is None:
                txs.append(DhcpTx(t, "discover", mac, seg.subnet, None, dev.hostname, fqdn(dev), L, 0, idx))
                continue
            pool.reserved_for.pop(ip, None)
            pool.holder[ip] = (mac, INF)
            if seg.pre:
                ack0 = t - rng.randrange(1, L * US // 2)
                start = t
            else:
                dur = rng.randrange(3_000, 900_000) if txkind == "dora" else rng.randrange(1_000, 20_000)
                txs.append(DhcpTx(t, txkind, mac, seg.subnet, ip, dev.hostname, fqdn(dev), L, dur, idx))
                ack0 = t + dur
                start = ack0
            last_ip[(mac, seg.subnet)] = ip
            holdings[idx].append(Holding(start, seg.end, ip, seg.subnet))
            active[(idx, k)] = (ip, ack0, len(holdings[idx]) - 1)
            # renewals at T1 while online
            half = L * US // 2
            r = ack0 + half
            while r < seg.end:
                if r >= plan.start:
                    txs.append(DhcpTx(r, "renew", mac, seg.subnet, ip, dev.hostname, fqdn(dev), L,
                                      rng.randrange(500, 8_000), idx))
                r += half
            heapq.heappush(ev, (seg.end, 0, seq, "leave", (idx, k)))
            seq += 1
        else:  # leave
            if (idx, k) not in active:
                continue
            ip, ack0, hi = active.pop((idx, k))
            half = L * US // 2
            last_ack = ack0 + max(0, (t - ack0) // half) * half
            if t >= plan.end:
                lease_end = last_ack + L * US
            elif seg.release:
                txs.append(DhcpTx(t, "release", mac, seg.subnet, ip, dev.hostname, None, L, 0, idx))
                lease_end = t
                if seg.reserve_for is not None:
                    pool.reserved_for[ip] = devs[seg.reserve_for].mac
            else:
                lease_end = last_ack + L * US
            pool.holder[ip] = (mac, lease_end)
            h = holdings[idx][hi]
            owners.setdefault(ip, []).append((h.start, min(lease_end, plan.end), mac))
    plan.holdings = holdings
    plan.dhcp = sorted(txs, key=lambda x: (x.ts, x.mac))
    for ip in owners:
        owners[ip].sort()
    plan.ip_owners = owners


def owner_at(plan: Plan, ip: str, t: int) -> str | None:
    """MAC address whose lease covers ``ip`` at time ``t`` (None if unleased)."""
    spans = plan.ip_owners.get(ip, ())
    i = bisect.bisect_right([s[0] for s in spans], t) - 1
    while i >= 0:
        a, b, mac = spans[i]
        if a <= t < b:
            return mac
        i -= 1
    return None
