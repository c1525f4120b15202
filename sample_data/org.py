"""The simulated organisation: network plan, devices (the inventory) and the Internet they
talk to (domains, their addresses, CDNs). Built once per run from Faker pools seeded with
the run's seed; nothing here calls Faker per event.
"""
from __future__ import annotations

import bisect
import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from faker import Faker

US = 1_000_000

DHCP_SERVER = "10.0.0.1"
RESOLVERS = ("10.0.0.53", "10.0.0.54")

# Device-type mix (fractions of --hosts); laptops take the remainder.
TYPE_MIX = (("desktop", 0.25), ("phone", 0.12), ("server", 0.06), ("printer", 0.04), ("iot", 0.06))

OUIS = {
    "laptop": ("a4:34:d9", "f8:63:3f", "3c:22:fb", "8c:16:45", "54:ee:75", "d4:81:d7"),
    "desktop": ("b8:85:84", "3c:52:82", "6c:4b:90", "f4:8e:38"),
    "server": ("00:50:56", "14:18:77", "b0:26:28"),
    "printer": ("3c:d9:2b", "30:05:5c", "00:26:73"),
    "iot": ("ac:cc:8e", "44:61:32", "18:b4:30"),
}
OS_BY_TYPE = {
    "laptop": (("Windows 11", 0.6), ("macOS 15", 0.3), ("Ubuntu 24.04", 0.1)),
    "desktop": (("Windows 11", 0.85), ("Windows 10", 0.15)),
    "phone": (("iOS 18", 0.55), ("Android 15", 0.45)),
    "server": (("Windows Server 2022", 0.4), ("Ubuntu 24.04", 0.4), ("Debian 12", 0.2)),
    "printer": (("embedded", 1.0),),
    "iot": (("embedded Linux", 1.0),),
}
DEPARTMENTS = ("Finance", "Engineering", "Sales", "Marketing", "HR", "Legal", "Support", "Operations")
SERVER_ROLES = ("dc01", "fs01", "app01", "dc02", "db01", "build01", "backup01", "web01")

# Real, popular sites with the third-party hosts their pages pull in.
POPULAR_SITES = (
    ("www.google.com", ("www.gstatic.com", "fonts.gstatic.com", "apis.google.com")),
    ("outlook.office365.com", ("login.microsoftonline.com", "res.cdn.office.net", "substrate.office.com")),
    ("teams.microsoft.com",
     ("login.microsoftonline.com", "statics.teams.cdn.office.net", "presence.teams.microsoft.com")),
    ("www.youtube.com", ("i.ytimg.com", "yt3.ggpht.com", "rr3---sn-4g5ednsz.googlevideo.com", "www.gstatic.com")),
    ("github.com", ("github.githubassets.com", "avatars.githubusercontent.com", "api.github.com")),
    ("app.slack.com", ("edgeapi.slack.com", "a.slack-edge.com", "wss-primary.slack.com")),
    ("zoom.us", ("us05web.zoom.us", "st1.zoom.us")),
    ("www.linkedin.com", ("static.licdn.com", "media.licdn.com")),
    ("en.wikipedia.org", ("upload.wikimedia.org", "meta.wikimedia.org")),
    ("www.amazon.com", ("m.media-amazon.com", "images-na.ssl-images-amazon.com", "fls-na.amazon.com")),
    ("stackoverflow.com", ("cdn.sstatic.net", "i.sstatic.net", "www.googletagmanager.com")),
    ("www.bbc.co.uk", ("static.files.bbci.co.uk", "ichef.bbci.co.uk")),
    ("www.nytimes.com", ("static01.nyt.com", "a.et.nytimes.com", "www.googletagmanager.com")),
    ("www.reddit.com", ("www.redditstatic.com", "preview.redd.it", "gql.reddit.com")),
    ("www.salesforce.com", ("login.salesforce.com", "c.salesforce.com")),
    ("drive.google.com", ("docs.google.com", "lh3.googleusercontent.com", "apis.google.com")),
    ("www.dropbox.com", ("cfl.dropboxstatic.com", "api.dropboxapi.com")),
    ("open.spotify.com", ("open.spotifycdn.com", "api-partner.spotify.com")),
    ("www.apple.com", ("www.apple.com.edgekey.net", "securemetrics.apple.com")),
    ("www.icloud.com", ("p55-contacts.icloud.com", "setup.icloud.com")),
    ("www.atlassian.com", ("id.atlassian.com", "api.atlassian.com")),
    ("docs.python.org", ("www.python.org",)),
    ("www.cloudflare.com", ("static.cloudflareinsights.com",)),
    ("weather.com", ("s.w-x.co", "www.googletagmanager.com")),
)
THIRD_PARTY = (
    "www.googletagmanager.com", "www.google-analytics.com", "fonts.googleapis.com",
    "cdn.jsdelivr.net", "cdnjs.cloudflare.com", "ajax.googleapis.com", "connect.facebook.net",
    "static.cloudflareinsights.com", "js.hs-scripts.com", "cdn.segment.com", "script.hotjar.com",
    "securepubads.g.doubleclick.net", "stats.g.doubleclick.net", "code.jquery.com",
)
TELEMETRY = (
    "v10.events.data.microsoft.com", "self.events.data.microsoft.com", "settings-win.data.microsoft.com",
    "ctldl.windowsupdate.com", "ocsp.digicert.com", "login.live.com", "edge.microsoft.com",
)
APPLE_BG = ("gateway.icloud.com", "gsp-ssl.ls.apple.com", "mesu.apple.com", "ocsp.apple.com")
NTP_SERVERS = {"Windows": "time.windows.com", "macOS": "time.apple.com", "iOS": "time.apple.com",
               "Android": "time.android.com", "other": "pool.ntp.org"}
CDN_SUFFIXES = ("edgekey.net", "cloudfront.net", "azureedge.net", "akamaiedge.net", "fastly.net",
                "cdn.cloudflare.net")
IOT_CLOUDS = {"ac:cc:8e": "dispatcher.axis.com", "44:61:32": "api.ecobee.com", "18:b4:30": "nexus.dropcam.com"}
PUSH = {"iOS": ("api.push.apple.com", 5223), "Android": ("mtalk.google.com", 5228)}


@dataclass(frozen=True)
class Subnet:
    idx: int
    prefix: str          # "10.0.2"
    wired: bool
    lease_time: int      # seconds

    @property
    def gateway(self) -> str:
        return f"{self.prefix}.1"

    @property
    def name(self) -> str:
        return f"{self.prefix}.0/24"


@dataclass
class Device:
    idx: int
    mac: str
    hostname: str
    owner: str
    owner_email: str
    department: str
    device_type: str
    os: str
    first_seen: str
    subnet: int                    # home subnet index
    reserved_ip: str | None = None
    activity: float = 1.0
    role: str | None = None        # server role (dc01, fs01, ...)
    in_inventory: bool = True
    phase: int = 0                 # iot check-in phase (µs)

    @property
    def family(self) -> str:
        return self.os.split()[0]


@dataclass
class DomainInfo:
    name: str
    apex: str
    ips: tuple[str, ...]
    ipv6: tuple[str, ...]
    cname: str | None
    ttl: int


@dataclass
class Site:
    primary: str
    deps: tuple[str, ...]


@dataclass
class Org:
    company: str
    zone: str                       # internal DNS zone, e.g. corp.acme.com
    subnets: list[Subnet]
    devices: list[Device]
    domains: dict[str, DomainInfo]
    sites: list[Site]
    site_cum: list[float]
    ext_pool: list[str]             # spare public IPs (scenario infrastructure)
    words: list[str]
    names: list[tuple[str, str]]
    internal_names: dict[str, str] = field(default_factory=dict)   # fqdn -> ip

    def pick_site(self, r: float) -> Site:
        return self.sites[bisect.bisect_left(self.site_cum, r * self.site_cum[-1])]

    @property
    def wired_subnets(self) -> list[Subnet]:
        return [s for s in self.subnets if s.wired]

    @property
    def wifi_subnets(self) -> list[Subnet]:
        return [s for s in self.subnets if not s.wired]

    def server(self, role: str) -> Device | None:
        for d in self.devices:
            if d.role == role:
                return d
        servers = [d for d in self.devices if d.device_type == "server"]
        return servers[0] if servers else None


def apex_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) >= 3 and parts[-2] in ("co", "com", "org", "ac") and len(parts[-1]) == 2:
        return ".".join(parts[-3:])
    return ".".join(parts[-2:])


def _weighted(rng: random.Random, pairs) -> str:
    r = rng.random() * sum(w for _, w in pairs)
    for v, w in pairs:
        r -= w
        if r <= 0:
            return v
    return pairs[-1][0]


def _mac(rng: random.Random, oui: str | None) -> str:
    if oui is None:
        # locally administered (randomised per-SSID) address, as phones use today
        first = (rng.randrange(256) & 0xFC) | 0x02
        rest = [rng.randrange(256) for _ in range(5)]
        return ":".join(f"{b:02x}" for b in [first] + rest)
    return oui + ":" + ":".join(f"{rng.randrange(256):02x}" for _ in range(3))


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", s.lower())


def build_org(seed: int, hosts: int, start_us: int) -> Org:
    """The organisation for ``seed``: ``hosts`` inventory devices on a 10.0.0.0/16 network."""
    fake = Faker("en_US")
    fake.seed_instance(seed)
    rng = random.Random(f"{seed}:org")

    company = fake.company()
    zone = f"corp.{_slug(company.split()[0].split(',')[0])[:12] or 'example'}.com"

    # device types
    counts: dict[str, int] = {}
    for t, frac in TYPE_MIX:
        counts[t] = int(hosts * frac)
    counts["server"] = max(1, counts["server"])
    counts["desktop"] = max(1, counts["desktop"])
    counts["phone"] = max(1, counts["phone"])
    counts["laptop"] = hosts - sum(counts.values())
    while counts["laptop"] < 3:
        for t in ("iot", "printer", "phone", "desktop"):
            if counts["laptop"] >= 3:
                break
            if counts[t] > (1 if t in ("desktop", "phone") else 0):
                counts[t] -= 1
                counts["laptop"] += 1
        else:
            break
    types = (["server"] * counts["server"] + ["laptop"] * counts["laptop"]
             + ["desktop"] * counts["desktop"] + ["phone"] * counts["phone"]
             + ["printer"] * counts["printer"] + ["iot"] * counts["iot"])

    # subnets: wired 10.0.1.0/24 (+10.0.4.. if needed), wifi 10.0.2.0/24 and 10.0.3.0/24 (+..)
    n_wired = sum(1 for t in types if t in ("desktop", "server", "printer", "iot"))
    n_wifi = len(types) - n_wired
    wired_count = max(1, -(-int(n_wired * 1.3) // 240))
    wifi_count = max(2, -(-int(n_wifi * 1.6 + 160) // 240))
    subnets: list[Subnet] = []
    octets = [1, 2, 3] + list(range(4, 4 + wired_count + wifi_count))
    i = 0
    subnets.append(Subnet(0, f"10.0.{octets[i]}", True, 14400))
    i += 1
    for _ in range(2):
        subnets.append(Subnet(len(subnets), f"10.0.{octets[i]}", False, 3600))
        i += 1
    for _ in range(wired_count - 1):
        subnets.append(Subnet(len(subnets), f"10.0.{octets[i]}", True, 14400))
        i += 1
    for _ in range(wifi_count - 2):
        subnets.append(Subnet(len(subnets), f"10.0.{octets[i]}", False, 3600))
        i += 1
    wired_ids = [s.idx for s in subnets if s.wired]
    wifi_ids = [s.idx for s in subnets if not s.wired]

    # people
    names: list[tuple[str, str]] = []
    seen_names = set()
    while len(names) < hosts + 40:
        fn, ln = fake.first_name(), fake.last_name()
        if (fn, ln) not in seen_names and re.fullmatch(r"[A-Za-z]+", fn + ln):
            seen_names.add((fn, ln))
            names.append((fn, ln))
    words = sorted({w for w in (fake.word() for _ in range(400)) if w.isalpha() and len(w) > 3})

    devices: list[Device] = []
    hostnames: set[str] = set()
    person = 0
    role_i = 0
    reserved_next = {sid: 10 for sid in wired_ids}
    start_dt = datetime.fromtimestamp(start_us // US, timezone.utc)
    for idx, t in enumerate(types):
        os_name = _weighted(rng, OS_BY_TYPE.get(t, (("embedded", 1.0),)))
        dept = DEPARTMENTS[rng.randrange(len(DEPARTMENTS))]
        role = None
        reserved = None
        if t in ("laptop", "desktop", "phone"):
            fn, ln = names[person]
            person += 1
            owner = f"{fn} {ln}"
            email = f"{fn.lower()}.{ln.lower()}@{zone.split('.', 1)[1]}"
            if t == "laptop":
                base = f"LT-{fn[0]}{ln}".upper()[:15]
            elif t == "desktop":
                base = f"WS-{dept[:3].upper()}-{rng.randrange(100, 999)}"
            else:
                base = (f"{fn}s-iPhone" if os_name.startswith("iOS")
                        else f"Galaxy-S{rng.choice((22, 23, 24))}" if rng.random() < 0.5
                        else f"Pixel-{rng.choice((7, 8, 9))}")
            mac = _mac(rng, None if t == "phone" else rng.choice(OUIS[t]))
        else:
            owner = {"server": "IT Operations", "printer": "Facilities", "iot": "Facilities"}[t]
            email = f"{'it-ops' if t == 'server' else 'facilities'}@{zone.split('.', 1)[1]}"
            dept = "IT" if t == "server" else "Facilities"
            mac = _mac(rng, rng.choice(OUIS[t]))
            if t == "server":
                role = SERVER_ROLES[role_i] if role_i < len(SERVER_ROLES) else f"srv{role_i + 1:02d}"
                role_i += 1
                base = role
            elif t == "printer":
                pre = "NPI" if mac.startswith("3c:d9:2b") else "BRW"
                base = pre + mac.replace(":", "")[-6:].upper()
            else:
                oui = mac[:8]
                prefix = {"ac:cc:8e": "axis-", "44:61:32": "ecobee-", "18:b4:30": "nest-"}[oui]
                base = prefix + mac.replace(":", "")[-6:]
        hostname = base
        k = 2
        while hostname in hostnames:
            hostname = f"{base}-{k}"
            k += 1
        hostnames.add(hostname)
        if t in ("desktop", "server", "printer", "iot"):
            subnet = wired_ids[idx % len(wired_ids)] if len(wired_ids) > 1 else wired_ids[0]
            if t in ("server", "printer", "iot"):
                reserved = f"{subnets[subnet].prefix}.{reserved_next[subnet]}"
                reserved_next[subnet] += 1
        else:
            subnet = wifi_ids[rng.randrange(len(wifi_ids))]
        first_seen = (start_dt - timedelta(days=rng.randrange(20, 1200), seconds=rng.randrange(86400)))
        devices.append(Device(
            idx=idx, mac=mac, hostname=hostname, owner=owner, owner_email=email, department=dept,
            device_type=t, os=os_name, first_seen=first_seen.strftime("%Y-%m-%dT%H:%M:%SZ"),
            subnet=subnet, reserved_ip=reserved, activity=min(2.5, max(0.3, rng.lognormvariate(0, 0.4))),
            role=role, phase=rng.randrange(300 * US),
        ))

    # the Internet
    ext: list[str] = []
    seen_ip: set[str] = set()
    while len(ext) < 4200:
        ip = fake.ipv4_public()
        if ip not in seen_ip:
            seen_ip.add(ip)
            ext.append(ip)
    v6 = [fake.ipv6() for _ in range(600)]
    # long tail of sites: Faker-style domains (surname or surname-surname / word + TLD) from
    # pools drawn once, which is much cheaper than 1,600 calls of fake.domain_name()
    surnames = sorted({_slug(fake.last_name()) for _ in range(500)})
    tlds = [fake.tld() for _ in range(40)] + ["com"] * 40
    tail_set: set[str] = set()
    while len(tail_set) < 1600:
        a = rng.choice(surnames)
        r = rng.random()
        label = a if r < 0.45 else (f"{a}-{rng.choice(surnames)}" if r < 0.8 else f"{a}{rng.choice(words)}")
        tail_set.add(f"{label}.{rng.choice(tlds)}")
    tail = sorted(tail_set)
    rng.shuffle(tail)
    ip_i = 0

    domains: dict[str, DomainInfo] = {}

    def add(name: str, n_ips: int | None = None) -> None:
        nonlocal ip_i
        if name in domains:
            return
        n = n_ips or rng.choice((1, 1, 2, 2, 3, 4))
        ips = tuple(ext[(ip_i + k) % 3000] for k in range(n))
        ip_i += n
        six = tuple(v6[rng.randrange(len(v6))] for _ in range(rng.choice((0, 1, 2))))
        cname = None
        if rng.random() < 0.3:
            cname = f"{name.split('.')[0]}-{rng.randrange(10, 99)}.{rng.choice(CDN_SUFFIXES)}"
        ttl = rng.choice((20, 60, 60, 300, 300, 300, 300, 600, 3600))
        domains[name] = DomainInfo(name, apex_of(name), ips, six, cname, ttl)

    sites: list[Site] = []
    weights: list[float] = []
    for i, (primary, deps) in enumerate(POPULAR_SITES):
        add(primary)
        for d in deps:
            add(d)
        sites.append(Site(primary, deps))
        weights.append(60.0 / (i + 1) ** 0.8)
    for d in THIRD_PARTY + TELEMETRY + APPLE_BG + tuple(NTP_SERVERS.values()) + tuple(IOT_CLOUDS.values()):
        add(d)
    for name, _ in PUSH.values():
        add(name)
    for d in ("deb.debian.org", "archive.raspberrypi.org", "security.ubuntu.com", "archive.ubuntu.com",
              "packages.microsoft.com", "pypi.org", "files.pythonhosted.org", "registry.npmjs.org"):
        add(d)
    for j, apex in enumerate(tail):
        primary = ("www." + apex) if rng.random() < 0.6 else apex
        add(primary)
        deps = tuple(rng.sample(THIRD_PARTY, rng.choice((0, 1, 2, 3))))
        if rng.random() < 0.4:
            sub = f"{rng.choice(('static', 'cdn', 'img', 'assets', 'api'))}.{apex}"
            add(sub)
            deps = deps + (sub,)
        sites.append(Site(primary, deps))
        weights.append(4.0 / (j + 1) ** 0.6)
    cum = []
    acc = 0.0
    for w in weights:
        acc += w
        cum.append(acc)

    org = Org(company=company, zone=zone, subnets=subnets, devices=devices, domains=domains,
              sites=sites, site_cum=cum, ext_pool=ext[3000:], words=words, names=names)
    for d in devices:
        if d.device_type == "server":
            org.internal_names[f"{d.hostname}.{zone}"] = d.reserved_ip or ""
    dc = org.server("dc01")
    fs = org.server("fs01")
    app = org.server("app01")
    org.internal_names[f"intranet.{zone}"] = (app or dc).reserved_ip or ""
    org.internal_names[f"wiki.{zone}"] = (app or dc).reserved_ip or ""
    org.internal_names[f"files.{zone}"] = (fs or dc).reserved_ip or ""
    return org


def devices_csv(org: Org) -> str:
    """reference/devices.csv: the inventory (devices with ``in_inventory``)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["mac", "device", "owner", "owner_email", "department", "device_type", "os", "first_seen"])
    for d in org.devices:
        if d.in_inventory:
            w.writerow([d.mac, d.hostname, d.owner, d.owner_email, d.department, d.device_type, d.os,
                        d.first_seen])
    return buf.getvalue()
