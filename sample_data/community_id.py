"""Community ID v1 flow hashes (https://github.com/corelight/community-id-spec).

Zeek (``policy/protocols/conn/community-id-logging``) and Suricata (``community-id: yes``)
both write this value, so it is the key that joins a Suricata alert to a Zeek conn row.

>>> community_id_v1("1.2.3.4", "5.6.7.8", 1122, 3344, 6)
'1:wCb3OG7yAFWelaUydu0D+125CLM='
>>> community_id_v1("5.6.7.8", "1.2.3.4", 3344, 1122, 6)  # direction does not matter
'1:wCb3OG7yAFWelaUydu0D+125CLM='
"""
from __future__ import annotations

import binascii
import hashlib
import socket
import struct

TCP = 6
UDP = 17

_IP_BYTES: dict[str, bytes] = {}


def _ip_bytes(ip: str) -> bytes:
    b = _IP_BYTES.get(ip)
    if b is None:
        b = socket.inet_aton(ip)
        if len(_IP_BYTES) < 200_000:
            _IP_BYTES[ip] = b
    return b


def community_id_v1(saddr: str, daddr: str, sport: int, dport: int, proto: int, seed: int = 0) -> str:
    """The Community ID v1 string ("1:" + base64 SHA-1) of an IPv4 TCP/UDP flow.

    The endpoints are ordered (smaller address, or equal address and smaller port, first)
    before hashing ``seed(2) | saddr | daddr | proto(1) | pad(1) | sport(2) | dport(2)``.
    """
    sb = _ip_bytes(saddr)
    db = _ip_bytes(daddr)
    if sb > db or (sb == db and sport > dport):
        sb, db, sport, dport = db, sb, dport, sport
    data = _PACK(seed, sb, db, proto, sport, dport)
    return "1:" + binascii.b2a_base64(_SHA1(data).digest(), newline=False).decode("ascii")


_PACK = struct.Struct("!H4s4sBxHH").pack
_SHA1 = hashlib.sha1
