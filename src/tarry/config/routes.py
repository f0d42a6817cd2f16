"""Configuration of what lies outside tarry: routes (``[routes.NAME]`` and ``PUT
/v1/routes/{name}``), where the API's routes may deliver (``[egress]``) and the AMQP ingress
(``[rabbitmq]``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tarry.config._base import Section, problems, redact_url
from tarry.errors import InvalidArgument
from tarry.model.egress import EgressPolicy, parse_allow_entry
from tarry.model.route_policy import POLICY_FIELDS, RoutePolicy

__all__ = ["EgressConfig", "RabbitMQConfig", "RouteConfig"]

_POLICY_KEYS = set(POLICY_FIELDS)


class RouteConfig(Section):
    """A destination outside tarry: declared in ``tarry.toml`` (``[routes.NAME]``) or put at run
    time (``PUT /v1/routes/{name}``, kept in the catalog); both are validated here."""

    transport: Literal["http", "rabbitmq"]
    url: str
    """For ``http``: the URL tarry POSTs each due message to (``http://`` or ``https://``). For
    ``rabbitmq``: the AMQP URL (``amqp://`` or ``amqps://``)."""
    timeout_ms: int = Field(5_000, gt=0, le=600_000)
    headers: dict[str, str] = {}
    secrets: list[str] = []
    """``http``: Standard Webhooks secrets (``whsec_`` + base64 of 24–64 bytes). With any, each
    delivery carries ``webhook-id``, ``webhook-timestamp`` and one ``webhook-signature`` per
    secret, so a receiver holding either the old or the new secret verifies it (rotation).
    Never shown by ``GET /v1/routes`` nor logged."""
    # Delivery policy (README, "Per-route delivery policy"); checked by
    # ``tarry.model.route_policy.parse_route_policy``, the one place that knows the bounds.
    rate_per_s: float | None = None
    """Most deliveries started per second (spaced evenly; e.g. 0.5 = one every 2 s). Applied per
    route, without delaying other routes. Default: no limit."""
    concurrency: int | None = None
    """Most deliveries to this route under way at once. Default: 100 for ``http`` (its
    connection pool), no cap for ``rabbitmq``."""
    retries: int | None = None
    """Attempts after the first before a message is dead-lettered (default: ``[dispatch]
    number_of_retries``)."""
    retry_backoff_ms: int | None = None
    """First retry delay, doubling per attempt (default: ``[dispatch] retry_backoff_ms``)."""
    retry_backoff_max_ms: int | None = None
    """Longest retry delay (default: ``[dispatch] retry_backoff_max_ms``)."""
    retry_jitter: float | None = None
    """Each retry delay is spread by ± this fraction (default 0.2)."""
    on_failure_report_to: str | None = None
    """A queue, topic or route that gets a JSON report when a message for this route is
    dead-lettered (reason, original id, destination, attempts)."""
    dead_letter_to: str | None = None
    """The queue a message for this route goes to when it is dead-lettered, instead of
    ``[dispatch] error_queue`` (shared by every tenant): name one inside the tenant's names so
    its token reads its own failures. Not a declared queue when a message dies: the error
    queue."""
    _policy: Any = PrivateAttr(default=None)
    exchange: str = ""
    """``rabbitmq``, mode ``store``: the exchange a due message is published to (``""``: the
    default exchange, which routes to the queue named by ``routing_key``)."""
    routing_key: str | None = None
    """``rabbitmq``: the routing key (mode ``store``) or the endpoint queue (mode ``native``);
    default: the route's name."""
    mode: Literal["store", "native"] = "store"
    """``rabbitmq``: ``store`` keeps the message in tarry until due, then publishes it;
    ``native`` publishes at send time into the delay topology and RabbitMQ does the waiting
    (tarry cannot cancel such a message)."""
    prefix: str = "tarry"
    """``native``: the delay topology's name prefix (``nsb.v2`` to share NServiceBus's)."""
    levels: int = Field(28, ge=1, le=28)
    """``native``: delay levels (longest delay 2^levels − 1 s); always 28 with ``nsb.v2``."""
    routing_topology: Literal["direct", "conventional"] = "direct"
    """``native``: how the endpoint is bound to the delivery exchange, as NServiceBus's routing
    topology of that name does it: ``direct`` binds the queue (any queue works);
    ``conventional`` binds the endpoint's own exchange, named like its queue (exchange to
    exchange), which a conventional NServiceBus endpoint declares."""
    queue_type: Literal["quorum", "classic"] = "quorum"
    """``native``: level queues' type; quorum dead-letters at-least-once, classic at most once."""
    declare_topology: bool = True
    """``native``: declare the topology (idempotently) before the first send."""

    @field_validator("url")
    @classmethod
    def _url_is_reachable(cls, url: str, info: ValidationInfo) -> str:
        from tarry.model.route_rules import check_route_url

        transport = info.data.get("transport")
        if transport is None:
            return url  # its own error says the transport is missing
        try:
            return check_route_url(transport, url)
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None

    @field_validator("headers")
    @classmethod
    def _headers_can_be_sent(cls, headers: dict[str, str]) -> dict[str, str]:
        from tarry.model.route_rules import check_route_headers

        try:
            return check_route_headers(headers)
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None

    @field_validator("secrets")
    @classmethod
    def _secrets_are_whsec(cls, secrets: list[str]) -> list[str]:
        from tarry.model.route_rules import check_secrets

        try:
            return check_secrets(secrets)
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None

    @model_validator(mode="after")
    def _topology_is_valid(self) -> RouteConfig:
        from tarry.model.topology import Topology
        from tarry.model.validate import check_name

        try:
            if self.secrets and self.transport != "http":
                raise InvalidArgument("secrets sign webhooks: only an http route takes them")
            if self.on_failure_report_to is not None:
                check_name(self.on_failure_report_to, field="on_failure_report_to")
            Topology(prefix=self.prefix, levels=self.levels)
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None
        return self

    @classmethod
    def parse(cls, name: str, data: Any) -> RouteConfig:
        """A route from a request body (``PUT /v1/routes/{name}``); raises ``invalid_argument``
        naming each field that is wrong and why."""
        if not isinstance(data, dict):
            raise InvalidArgument("a route must be a JSON object")
        try:
            # Strict: JSON has its types, so 0 is no false and "5" no number (as a send's).
            return cls.model_validate(data, strict=True)
        except ValidationError as exc:
            raise InvalidArgument(f"route {name!r} is not valid: {problems(exc)}") from None

    @model_validator(mode="after")
    def _policy_is_valid(self) -> RouteConfig:
        from tarry.model.route_policy import DEFAULT_HTTP_CONCURRENCY, parse_route_policy

        try:
            policy = parse_route_policy(
                self.model_dump(include=_POLICY_KEYS),
                default_concurrency=DEFAULT_HTTP_CONCURRENCY if self.transport == "http" else None,
            )
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None
        if policy.limited and self.transport == "rabbitmq" and self.mode == "native":
            raise ValueError(
                'a route with mode = "native" hands each message to RabbitMQ when it is sent, '
                'so rate_per_s and concurrency cannot apply; drop them or use mode = "store"'
            )
        self._policy = policy
        return self

    @property
    def policy(self) -> RoutePolicy:
        """The route's delivery policy, as checked when the route was read."""
        policy: RoutePolicy = self._policy
        return policy

    def redacted(self) -> dict[str, Any]:
        """The route as logs and ``GET /v1/routes`` show it: no credentials, no header values,
        each secret as a fingerprint."""
        from tarry.model.route_rules import secret_fingerprint

        data = self.model_dump(mode="json")
        data["url"] = redact_url(self.url)
        data["headers"] = {k: "***" for k in self.headers}
        data["secrets"] = [secret_fingerprint(s) for s in self.secrets]
        return data


class EgressConfig(Section):
    """Where routes put through the API (``PUT /v1/routes/{name}``) may deliver (README, "Route
    destinations and server-side requests"). Routes of ``tarry.toml`` are the operator's own and
    are not checked."""

    internal: Literal["auto", "refuse", "allow"] = "auto"
    """``refuse``: such a route may not reach loopback, link-local (cloud metadata), private,
    multicast or other addresses that are not globally routable, unless ``allow`` lists them;
    checked when the route is put and at each connection, after DNS resolution. ``allow``: no
    check. ``auto``: ``refuse`` when ``[auth]`` has tokens, ``allow`` when it has none (such a
    server listens on loopback only: a developer's own machine)."""
    allow: list[str] = []
    """Exceptions: host names (exact), addresses and CIDR blocks, e.g. ``["hooks.internal",
    "10.1.2.0/24", "127.0.0.1"]``."""

    @field_validator("allow")
    @classmethod
    def _entries(cls, allow: list[str]) -> list[str]:
        try:
            for entry in allow:
                parse_allow_entry(entry)
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None
        return allow

    def policy(self, *, authenticated: bool) -> EgressPolicy:
        """The guard in force, given whether the server has tokens."""
        allow_all = self.internal == "allow" or (self.internal == "auto" and not authenticated)
        return EgressPolicy.from_entries(self.allow, allow_all=allow_all)


class RabbitMQConfig(Section):
    """The AMQP ingress: any AMQP client schedules by publishing to ``ingress_queue``."""

    url: str = "amqp://guest:guest@127.0.0.1:5672/"
    ingress: bool = False
    """Consume ``ingress_queue`` and schedule what arrives there."""
    ingress_queue: str = "tarry.schedule"
    ingress_token: str | None = None
    """The ``name`` of the ``[[auth.tokens]]`` entry the ingress acts as: each message it takes
    is checked against that token's ``send`` globs (its destination, and ``reply_to`` when it
    asks for reports), as ``POST /v1/messages`` with that token would be, and one refused goes
    to ``dead_letter_exchange`` with code ``not_authorized``. Required when tokens are
    configured (a token with ``send = ["*"]`` lets the ingress send anywhere)."""
    queue_type: Literal["quorum", "classic"] = "quorum"
    """Type of the ingress queue when tarry declares it."""
    dead_letter_exchange: str = "tarry.schedule.rejected"
    """Where a message that breaks a rule goes, with ``tarry-error-code`` and
    ``tarry-error-message`` headers (a fanout exchange, declared by tarry)."""
    dead_letter_queue: str | None = "tarry.schedule.rejected"
    """A queue bound to ``dead_letter_exchange`` so rejects are kept (None: bind your own)."""
    prefetch: int = Field(200, gt=0)
    """Unacked messages in flight; tarry stores them in batches and acks each once durable."""
    timeout_ms: int = Field(5_000, gt=0)
    """Connect and publish-confirm timeout."""
