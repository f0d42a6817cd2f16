"""``HttpTransport``: delivers a due message by POSTing its body to a route's URL (a webhook).

2xx means accepted. 408, 429, 5xx, connection errors and timeouts are transient (retried);
other 4xx are permanent (the error queue at once). httpx's exceptions are translated in one
place, ``_delivery_failed``. A route with ``secrets`` signs each attempt (``signing.py``).
A route put through the API is checked against ``[egress]`` when built and at each connection
(``egress.py``); a refused address fails the delivery for good (``forbidden_address``).
A 429 or 503 carries the receiver's ``Retry-After`` (as given:
seconds or an HTTP-date) in ``details["retry_after"]``; the dispatcher starts nothing for the
route before it.
"""

from __future__ import annotations

import httpx

from tarry.config import RouteConfig, redact_url
from tarry.errors import DeliveryFailed, ForbiddenAddress
from tarry.model.egress import ALLOW_ALL, EgressPolicy
from tarry.model.message import Message
from tarry.model.time import Clock, SystemClock
from tarry.transports.egress import GuardedTransport, checked_addresses
from tarry.transports.signing import Signer

__all__ = ["HttpTransport"]

_TRANSIENT_STATUS = frozenset({408, 425, 429})
#: How long a put waits for the route's host to resolve before leaving it to delivery time.
_RESOLVE_TIMEOUT_S = 2.0
#: Statuses whose ``Retry-After`` says when the receiver takes requests again (RFC 9110).
_RETRY_AFTER_STATUS = frozenset({429, 503})


class HttpTransport:
    def __init__(
        self,
        route: RouteConfig,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Clock | None = None,
        egress: EgressPolicy = ALLOW_ALL,
    ) -> None:
        egress.check_url(route.url)
        self._egress = egress
        self.route = route
        self._clock = clock or SystemClock()
        self._signer = Signer(route.secrets) if route.secrets else None
        #: The URL as failures (the error queue's headers, logs) show it: no credentials.
        self._shown_url = redact_url(route.url)
        self._owns_client = client is None
        # The route's lane never has more deliveries under way than its concurrency (100 by
        # default), so the pool holds that many connections, kept alive between deliveries,
        # and no request waits for a connection inside httpx (where a burst timed out).
        cap = route.policy.concurrency
        limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap)
        guarded = None if egress.allow_all else GuardedTransport(egress, limits=limits)
        self._client = client or httpx.AsyncClient(
            timeout=route.timeout_ms / 1000, limits=limits, transport=guarded
        )

    async def check_address(self) -> None:
        """Resolve the route's host now and raise ``forbidden_address`` when the guard refuses
        what it resolves to, so a put is refused at once rather than its deliveries later. A
        name that does not resolve yet passes (each connection checks it again)."""
        if self._egress.allow_all:
            return
        url = httpx.URL(self.route.url)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            await checked_addresses(self._egress, url.host, port, _RESOLVE_TIMEOUT_S)
        except (OSError, TimeoutError):
            pass

    def headers_for(self, message: Message) -> dict[str, str]:
        headers = dict(message.headers)
        headers.update(self.route.headers)
        headers["tarry-id"] = message.id
        headers["tarry-destination"] = message.destination
        headers["tarry-deliver-at"] = str(message.deliver_at_ms)
        headers["tarry-sent-at"] = str(message.sent_at_ms)
        if message.message_id is not None:
            headers["tarry-message-id"] = message.message_id
        if message.correlation_id is not None:
            headers["tarry-correlation-id"] = message.correlation_id
        headers.setdefault("content-type", "application/octet-stream")
        if self._signer is not None:  # last: no header of the message or route replaces these
            timestamp_s = self._clock.now_ms() // 1000
            headers.update(self._signer.headers(message.id, timestamp_s, message.body))
        return headers

    async def deliver(self, message: Message) -> None:
        try:
            response = await self._client.post(
                self.route.url, content=message.body, headers=self.headers_for(message)
            )
        except httpx.HTTPError as exc:
            raise _delivery_failed(self._shown_url, exc) from exc
        except ForbiddenAddress as exc:
            raise DeliveryFailed(exc.message, reason=exc.code, permanent=True) from exc
        status = response.status_code
        if 200 <= status < 300:
            return
        transient = status >= 500 or status in _TRANSIENT_STATUS
        details: dict[str, str] = {}
        retry_after = response.headers.get("retry-after")
        if retry_after is not None and status in _RETRY_AFTER_STATUS:
            details["retry_after"] = retry_after
        raise DeliveryFailed(
            f"{self._shown_url} answered HTTP {status}",
            reason=f"http_{status}",
            permanent=not transient,
            **details,
        )

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _delivery_failed(url: str, exc: httpx.HTTPError) -> DeliveryFailed:
    """httpx's failures, once: all transport-level errors are worth retrying."""
    if isinstance(exc, httpx.TimeoutException):
        return DeliveryFailed(f"{url} timed out: {exc}", reason="timeout", permanent=False)
    if isinstance(exc, httpx.ConnectError):
        return DeliveryFailed(f"cannot connect to {url}: {exc}", reason="connect", permanent=False)
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return DeliveryFailed(f"{url} is not a usable URL: {exc}", reason="bad_url", permanent=True)
    return DeliveryFailed(
        f"HTTP delivery to {url} failed: {exc}", reason="http_error", permanent=False
    )
