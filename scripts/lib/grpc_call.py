#!/usr/bin/env python3
"""One unary gRPC call over mutual TLS with curl (HTTP/2), no generated code:

    python3 scripts/lib/grpc_call.py <url> <certs dir> <identity> /pkg.Service/Method FIELD...

FIELD is `<number>=<string>` or `<number>:<integer>` (a varint), the request message's
fields. <certs dir>/ca.pem is the CA; <identity>.pem and <identity>-key.pem the client's
certificate and key (scripts/dev-up's .dev/certs). Prints the answer's top-level fields as
JSON ({"<number>": value}: strings decoded as UTF-8, varints as integers, nested messages
as hex); exits 1 with the grpc-status and message when the call fails.

scripts/test-new-service calls the new service (and inventory) with it: a new service's
contract lives in its crate, and curl speaks HTTP/2 and TLS already.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote


def varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(fields: list[str]) -> bytes:
    out = bytearray()
    for field in fields:
        m = re.fullmatch(r"(\d+)([=:])(.*)", field, re.S)
        if not m:
            raise SystemExit(f"grpc_call: bad field {field!r} (<number>=<string> or <number>:<integer>)")
        number, kind, value = int(m[1]), m[2], m[3]
        if kind == "=":
            data = value.encode()
            out += varint(number << 3 | 2) + varint(len(data)) + data
        else:
            out += varint(number << 3) + varint(int(value))
    return bytes(out)


def read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def decode(data: bytes) -> dict[str, object]:
    out: dict[str, object] = {}
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            length, i = read_varint(data, i)
            raw = data[i:i + length]
            i += length
            try:
                value = raw.decode()
                if not value.isprintable():
                    value = raw.hex()
            except UnicodeDecodeError:
                value = raw.hex()
        elif wire == 1:
            value, i = int.from_bytes(data[i:i + 8], "little"), i + 8
        elif wire == 5:
            value, i = int.from_bytes(data[i:i + 4], "little"), i + 4
        else:
            raise SystemExit(f"grpc_call: cannot decode wire type {wire}")
        out[str(number)] = value
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    url, certs, identity, method, *fields = argv
    certs_dir = Path(certs)
    body = encode(fields)
    frame = b"\0" + len(body).to_bytes(4, "big") + body
    with tempfile.TemporaryDirectory(prefix="grpc-call-") as tmp:
        headers = Path(tmp) / "headers"
        done = subprocess.run(
            ["curl", "-sS", "--http2", "--max-time", "30", "--cacert", str(certs_dir / "ca.pem"),
             "--cert", str(certs_dir / f"{identity}.pem"), "--key", str(certs_dir / f"{identity}-key.pem"),
             "-H", "content-type: application/grpc", "-H", "te: trailers", "--data-binary", "@-",
             "-D", str(headers), "-o", "-", url.rstrip("/") + method],
            input=frame, capture_output=True,
        )
        if done.returncode != 0:
            print(f"grpc_call: curl failed ({done.returncode}): {done.stderr.decode().strip()}", file=sys.stderr)
            return 1
        # The trailers come with the headers in curl's header dump (HTTP/2).
        meta = {}
        for line in headers.read_text(errors="replace").splitlines():
            name, sep, value = line.partition(":")
            if sep:
                meta[name.strip().lower()] = value.strip()
    status = meta.get("grpc-status")
    if status != "0":
        print(f"grpc_call: {method}: grpc-status {status}: {unquote(meta.get('grpc-message', ''))}", file=sys.stderr)
        return 1
    data = done.stdout
    if len(data) < 5 or data[0] != 0:
        print(f"grpc_call: {method}: no uncompressed message in the answer ({len(data)} bytes)", file=sys.stderr)
        return 1
    length = int.from_bytes(data[1:5], "big")
    print(json.dumps(decode(data[5:5 + length])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
