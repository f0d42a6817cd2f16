"""What signing a webhook costs (issue 25; delivery throughput is ``webhooks.py``). Prints one
JSON document on stdout.

    .venv/bin/python bench/signing.py

Sections:
- ``signing``: what signing a delivery costs (Standard Webhooks, ``tarry.transports.signing``),
  in CPU µs per message: ``Signer.headers`` alone by body size and number of secrets (2 while a
  secret is rotated), a UTF-8 body (the reference library's path) and a binary one (HMAC over
  the bytes); and the headers a delivery is sent with (``HttpTransport.headers_for``) with and
  without secrets, measured in the same run (``ratio_signed_to_unsigned``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tarry.config import RouteConfig
from tarry.model.message import Message
from tarry.transports.http import HttpTransport
from tarry.transports.signing import Signer


def _secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def _us_per_call(work: Callable[[], object], *, calls: int, repeats: int = 5) -> float:
    """The best of ``repeats`` runs of ``calls`` calls, in CPU µs per call (the best run is the
    one least disturbed by other work on a shared machine)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            work()
        best = min(best, (time.process_time() - started) / calls)
    return round(best * 1e6, 2)


def signing(*, calls: int) -> dict[str, Any]:
    """CPU µs per signed message, by body size, secrets and body kind."""
    two = [_secret(), _secret()]
    now_s = int(time.time())
    sizes = {"100B": 100, "1KiB": 1024, "64KiB": 64 * 1024}
    signer: dict[str, Any] = {}
    for label, size in sizes.items():
        text = b"x" * size
        binary = b"\xff" * size  # never valid UTF-8
        for secrets in (1, 2):
            sign = Signer(two[:secrets])
            for kind, body in (("utf8", text), ("binary", binary)):
                key = f"{label}_{secrets}_secret{'s' if secrets > 1 else ''}_{kind}"
                signer[key] = _us_per_call(
                    lambda s=sign, b=body: s.headers("01JDQ3R5X9M2V7K8P4W6T0Y1ZA", now_s, b),
                    calls=max(calls // (1 + size // 4096), 200),
                )

    body = json.dumps({"order": 42, "lines": list(range(20))}).encode()
    message = _message(body)
    plain = HttpTransport(RouteConfig(transport="http", url="http://127.0.0.1:9/hook"))
    signed = HttpTransport(
        RouteConfig(transport="http", url="http://127.0.0.1:9/hook", secrets=[two[0]])
    )
    unsigned_us = _us_per_call(lambda: plain.headers_for(message), calls=calls)
    signed_us = _us_per_call(lambda: signed.headers_for(message), calls=calls)
    asyncio.run(_close(plain, signed))
    return {
        "signer_cpu_us_per_message": signer,
        "headers_for_cpu_us_per_message": {
            "unsigned": unsigned_us,
            "signed_1_secret": signed_us,
            "added_by_signing": round(signed_us - unsigned_us, 2),
            "ratio_signed_to_unsigned": round(signed_us / unsigned_us, 2),
            "body_bytes": len(body),
        },
        "calls": calls,
    }


def _message(body: bytes) -> Message:
    now_ms = int(time.time() * 1000)
    return Message(
        id="01JDQ3R5X9M2V7K8P4W6T0Y1ZA",
        destination="hooks.bench",
        body=body,
        headers={"content-type": "application/json"},
        sent_at_ms=now_ms,
        deliver_at_ms=now_ms,
        expires_at_ms=None,
    )


async def _close(*transports: HttpTransport) -> None:
    for transport in transports:
        await transport.close()


SECTIONS: dict[str, Callable[..., dict[str, Any]]] = {"signing": signing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), help="run one section")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per signing figure")
    args = parser.parse_args()
    chosen = [args.only] if args.only else list(SECTIONS)
    out: dict[str, Any] = {"load_average": [round(x, 2) for x in os.getloadavg()]}
    for name in chosen:
        print(f"running {name} ...", file=sys.stderr)
        out[name] = SECTIONS[name](calls=args.calls)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
