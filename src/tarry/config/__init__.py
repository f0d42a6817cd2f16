"""tarry's configuration: one typed object, layered from defaults, ``tarry.toml``, ``TARRY_*``
environment variables (nested with ``__``, e.g. ``TARRY_SERVER__PORT=7421``) and CLI flags, in that
order. Components receive their own sub-object and never read the environment themselves.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from tarry.config._base import Section, problems, redact_url
from tarry.config.routes import EgressConfig, RabbitMQConfig, RouteConfig
from tarry.errors import InvalidArgument
from tarry.model.egress import EgressPolicy

__all__ = [
    "AuthConfig",
    "DispatchConfig",
    "EgressConfig",
    "JournalConfig",
    "RabbitMQConfig",
    "RouteConfig",
    "ScheduleConfig",
    "ServerConfig",
    "StoreConfig",
    "TarryConfig",
    "TokenConfig",
    "load_config",
    "redact_url",
    "token_sha256",
]


class ServerConfig(Section):
    host: str = "127.0.0.1"
    """Address to bind. Anything but loopback needs ``[auth]`` tokens."""
    port: int = Field(7420, ge=0, le=65535)
    """TCP port of the HTTP API (0 picks a free one and prints it)."""
    data_dir: Path = Path("./tarry-data")
    """Where the store, the journal and the lock file live."""
    auto_declare: bool = False
    """Create a local queue on the first send to an undeclared destination."""
    max_message_bytes: int = Field(4 * 1024 * 1024, gt=0)
    """Largest body any destination accepts."""
    retention_ms: int = Field(24 * 3_600_000, ge=0)
    """How long finished messages (acked, expired, cancelled, ...) stay visible to
    ``GET /v1/messages/{id}`` and keep their ``message_id`` for de-duplication."""
    max_batch: int = Field(10_000, gt=0)
    """Most messages in one ``POST /v1/messages/batch``."""
    max_batch_bytes: int | None = Field(None, gt=0)
    """Largest body of ``POST /v1/messages/batch``, refused with 413 while it is read (default:
    256 MiB, or one message's request limit if that is larger). A single message's request may
    be ``6 × max_message_bytes`` + 64 KiB (the longest JSON its body can become), any other
    request 1 MiB."""
    max_connections: int = Field(1024, gt=0)
    """Open client connections. At the cap a new connection closes the one that has waited
    longest for a request (or is itself closed if every connection has a request running);
    also uvicorn's ``limit_concurrency``. Lowered at start to what the process's open-file
    limit allows."""
    header_timeout_ms: int = Field(10_000, gt=0)
    """A connection that has not sent a whole request head this long after it opened (or after
    its last response) is closed."""
    keep_alive_ms: int = Field(5_000, gt=0)
    """An idle keep-alive connection is closed after this long (uvicorn's
    ``timeout_keep_alive``)."""
    max_header_bytes: int = Field(16 * 1024, ge=1024)
    """Largest request line plus headers; a larger one gets 400 (h11's
    ``max_incomplete_event_size``; counted by tarry under httptools)."""
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    """``auto``: uvloop when installed (``pip install 'tarry[fast]'``), else asyncio."""
    http_parser: Literal["auto", "h11", "httptools"] = "auto"
    """``auto``: httptools (C) when installed (``tarry[fast]``), else h11 (pure Python)."""
    tls_cert: Path | None = None
    """PEM certificate (chain) to serve HTTPS with; needs ``tls_key``."""
    tls_key: Path | None = None
    """PEM private key of ``tls_cert``."""
    allow_plaintext: bool = False
    """Serve plain HTTP on a non-loopback address (tokens are then sent in the clear; only
    behind a TLS-terminating proxy or on a trusted network)."""
    log_level: str = "info"
    log_format: Literal["text", "json"] = "text"
    """``text``: plain lines. ``json``: one JSON object a line (time, level, logger, message,
    and a message's ``id`` and ``destination`` where there is one), for log collectors."""

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("server.tls_cert and server.tls_key go together: give both or neither")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


class StoreConfig(Section):
    engine: Literal["log", "sqlite", "memory", "postgres"] = "log"
    """The delayed-message store: ``log`` (durable time-partitioned logs, the embedded default;
    local queues in ``<data_dir>/queues.db``), ``sqlite`` (one SQLite file for both),
    ``postgres`` (several nodes share one PostgreSQL database; needs ``dsn``) or ``memory``
    (nothing survives a restart; for tests and experiments)."""
    fsync: Literal["batch", "always", "never"] = "batch"
    """Log store durability (README, "Durability"): ``batch`` shares one fsync among the writes
    of ``commit_interval_ms`` and a 201 waits for it; ``always`` fsyncs every group at once;
    ``never`` leaves flushing to the OS (survives a process crash, not a power loss)."""
    commit_interval_ms: int = Field(2, ge=0, le=1000)
    """Log store: how long a group commit gathers writes before its fsync."""
    granularity_ms: int = Field(300_000, ge=1000)
    """Log store time-partition width. 5 minutes (Pulsar PIP-26's default) keeps the indexed
    partition small (at 10k msg/s, 3M entries = 48 MB) while a year is ~105k partitions."""
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    """Log store: a partition's segment file rolls over past this size."""
    snapshot_interval_ms: int = Field(60_000, gt=0)
    """Log store: how often the due partitions' index is snapshotted (and cleanup runs)."""
    dsn: str | None = None
    """For ``postgres``: ``postgresql://user:password@host:5432/dbname``. tarry creates and
    migrates its tables itself; every node of a cluster points at the same database."""
    consistency: Literal["exactly_once", "at_least_once"] = "exactly_once"
    """For ``postgres``. ``exactly_once``: local queues (with their declarations and policies)
    live in the same PostgreSQL database and every node sees them; a due message is moved into
    its queue in the same transaction that checks the claim and finishes it in the store, so it
    arrives once. ``at_least_once``: only the delayed messages are shared; each node keeps its
    local queues in its own embedded database and removes a message from PostgreSQL after its
    queue took it, so a node dying in between means another node delivers it again (same
    ``id``: consumers de-duplicate). Routes (HTTP, RabbitMQ) are at-least-once in both modes."""
    connect_timeout_ms: int = Field(3_000, gt=0)
    """For ``postgres``: how long a call waits for a connection before it fails with
    ``unavailable`` (and counts against the store and fetch breakers)."""
    pool_size: int = Field(4, gt=0, le=64)
    """For ``postgres``: connections per pool (a node has two pools and one LISTEN
    connection)."""
    path: Path | None = None
    """The SQLite file; default ``<data_dir>/tarry.db``."""
    synchronous: Literal["full", "normal"] = "full"
    """``full``: every commit is fsynced before a producer hears 201 (an acknowledged message
    survives power loss). ``normal``: survives a process crash, may lose the last commits on
    power loss."""
    max_pages: int | None = Field(None, gt=0)
    """Cap on the database size in pages (testing the store breaker with a full disk)."""
    queues_in_memory: bool = True
    """The log store only: plain messages released into local queues stay in memory until
    received and acked, or for 0.2 s, before they are written to the queue database
    (``tarry.engine.memory_queues``); ``false``: every release, receive and ack is a
    transaction of the queue database."""


class DispatchConfig(Section):
    batch_size: int = Field(500, gt=0)
    """Most due messages fetched and released in one round."""
    lease_ms: int = Field(30_000, gt=0)
    """How long a fetched message stays claimed before another attempt may take it."""
    max_sleep_ms: int = Field(60_000, gt=0)
    """Longest the dispatcher sleeps without looking at the store (MSMQ: 1 minute)."""
    tick_ms: int = Field(2, ge=0, le=1_000)
    """Shortest time between two rounds that find due messages (unless a round found a full
    batch): what falls due within it is released together with the next round. 0 releases
    each millisecond's messages as soon as they are due, at a round's cost each."""
    number_of_retries: int = Field(0, ge=0)
    """Delivery attempts after the first before a message goes to the error queue."""
    retry_backoff_ms: int = Field(1_000, ge=0)
    """First retry delay; doubles per attempt up to ``retry_backoff_max_ms``."""
    retry_backoff_max_ms: int = Field(60_000, ge=0)
    error_queue: str = "tarry.error"
    """Where undeliverable messages go (created on start), unless their route or queue names a
    ``dead_letter_to`` queue of its own (every tenant's failures meet here otherwise)."""
    time_to_trigger_store_ms: int = Field(30_000, gt=0)
    time_to_trigger_fetch_ms: int = Field(30_000, gt=0)
    time_to_trigger_dispatch_ms: int = Field(30_000, gt=0)
    maximum_recovery_failures_per_second: int = Field(1, gt=0)
    expiry_sweep_ms: int = Field(250, gt=0)
    """How often expired messages are swept out of queues (receive never returns them anyway)."""
    overload_lag_ms: int = Field(1_000, ge=0)
    """Release lag (how far behind due time the oldest due, unreleased message is, or how late
    the dispatcher is to wake) above which sends are refused with ``429 overloaded`` and a
    ``Retry-After``, rather than accepted to be delivered late. Sends to a queue are refused the
    same way once its delivery lag (how late its consumers would receive a message entering it
    now) passes half of it: the other half is kept for what was accepted already. 0 never
    refuses."""
    delivery_lag_window_ms: int = Field(10_000, gt=0)
    """A queue's delivery lag counts while a consumer received from it within this window; a
    queue nobody reads (storage, not a delivery) never makes the server refuse sends."""


class TokenConfig(Section):
    """One bearer token and the names it may act on. Give the secret as ``token`` or, to keep it
    out of the file, as ``token_sha256`` (its SHA-256 in hex, ``tarry token hash`` prints it)."""

    token: str | None = None
    token_sha256: str | None = None
    name: str = ""
    send: list[str] = []
    """Glob patterns of destinations this token may send to (and name as ``reply_to`` or
    ``dead_letter_to``)."""
    receive: list[str] = []
    """Glob patterns of queues this token may receive from, ack and nack (and read)."""
    admin: list[str] = []
    """Glob patterns of queues, topics and policies this token may declare, change and delete
    (and read); ``"*"`` alone may set policies of any pattern."""
    read: list[str] = []
    """Glob patterns of names whose messages' metadata, queue details and listings this token
    may read (``receive`` and ``admin`` imply it for their own globs)."""

    @field_validator("token_sha256")
    @classmethod
    def _sha256_hex(cls, value: str | None) -> str | None:
        if value is None:
            return None
        digest = value.strip().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(
                "token_sha256 must be 64 hex digits, the SHA-256 of the token "
                "(tarry token hash prints it)"
            )
        return digest

    @model_validator(mode="after")
    def _one_secret(self) -> TokenConfig:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError(
                "give each token exactly one of token or token_sha256 "
                f"(token {self.name or '(unnamed)'!r})"
            )
        if self.token is not None and not self.token.strip():
            raise ValueError("token must not be empty")
        return self


def token_sha256(secret: str) -> str:
    """What ``token_sha256`` holds for the bearer token ``secret`` (``tarry token hash``)."""
    return hashlib.sha256(secret.strip().encode("utf-8")).hexdigest()


class AuthConfig(Section):
    tokens: list[TokenConfig] = []


class ScheduleConfig(Section):
    """Recurring schedules (``PUT /v1/schedules/{name}``): how far ahead occurrences are stored
    as ordinary scheduled messages, and how nodes share the work."""

    horizon_ms: int = Field(600_000, gt=0)
    """Occurrences due within this span are stored ahead (and always the next one, however
    far): a restart or a node's death within it loses nothing, the store delivers them."""
    max_ahead: int = Field(100, gt=0)
    """Most occurrences of one schedule stored ahead (an every-second schedule stores 100 s)."""
    interval_ms: int = Field(1_000, gt=0)
    """How often a node looks for schedules to top up."""
    lease_ms: int = Field(30_000, gt=0)
    """A node tops up a schedule under a lease this long; another node takes over once it
    lapses (keep it shorter than ``server.retention_ms``: an occurrence stored again within it
    is de-duplicated by its ``message_id``)."""
    late_after_ms: int = Field(60_000, ge=0)
    """An occurrence this late when a node (re)starts, or never stored that long after its
    time, fell while tarry was down: the schedule's ``catch_up`` policy decides it."""


class JournalConfig(Section):
    enabled: bool = True
    max_bytes: int = Field(64 * 1024 * 1024, gt=0)
    """Rotate the current journal file past this size."""
    max_age_ms: int = Field(3_600_000, gt=0)
    """... or past this age."""
    flush_ms: int = Field(200, gt=0)
    node: str = ""
    """This node's name in journal records (default: the host name)."""


class TarryConfig(BaseSettings):
    """Everything ``tarry serve`` can be told."""

    model_config = SettingsConfigDict(
        env_prefix="TARRY_",
        env_nested_delimiter="__",
        extra="forbid",
        nested_model_default_partial_update=True,
    )

    server: ServerConfig = ServerConfig()
    store: StoreConfig = StoreConfig()
    dispatch: DispatchConfig = DispatchConfig()
    auth: AuthConfig = AuthConfig()
    journal: JournalConfig = JournalConfig()
    schedules: ScheduleConfig = ScheduleConfig()
    rabbitmq: RabbitMQConfig = RabbitMQConfig()
    egress: EgressConfig = EgressConfig()
    routes: dict[str, RouteConfig] = {}
    queues: dict[str, dict[str, Any]] = {}
    """Queues declared at start: ``[queues.orders] message_ttl_ms = 60000``."""
    topics: dict[str, list[str]] = {}
    """Topics declared at start with their subscribed queues: ``[topics] news = ["a", "b"]``."""

    @field_validator("routes")
    @classmethod
    def _route_names(cls, routes: dict[str, RouteConfig]) -> dict[str, RouteConfig]:
        from tarry.model.validate import check_name

        for name, route in routes.items():
            check_name(name, field="route name")
            if route.on_failure_report_to == name:
                raise ValueError(
                    f"route {name!r} cannot report its failures to itself; name a queue (for "
                    "example tarry.error) or another route in on_failure_report_to"
                )
        return routes

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment over the TOML file, which load_config passes in as init values;
        # load_config then lays the CLI flags over both.
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _postgres_needs_dsn(self) -> TarryConfig:
        if self.store.engine == "postgres" and not self.store.dsn:
            raise ValueError(
                'store.engine = "postgres" needs store.dsn = "postgresql://user@host:5432/db" '
                "(or --dsn)"
            )
        return self

    @model_validator(mode="after")
    def _ingress_acts_as_a_token(self) -> TarryConfig:
        self.ingress_token_config  # noqa: B018 - raises ValueError for a name that is no token
        if self.rabbitmq.ingress and self.auth.tokens and self.rabbitmq.ingress_token is None:
            raise ValueError(
                "rabbitmq.ingress on a server with [[auth.tokens]] needs rabbitmq.ingress_token "
                "= the name of the token whose send globs its messages are checked against "
                '(one with send = ["*"] lets it send anywhere)'
            )
        return self

    @property
    def ingress_token_config(self) -> TokenConfig | None:
        """The token the AMQP ingress acts as (``rabbitmq.ingress_token``), None without one."""
        name = self.rabbitmq.ingress_token
        if name is None:
            return None
        found = [t for t in self.auth.tokens if t.name == name]
        if len(found) != 1:
            named = ", ".join(repr(t.name) for t in self.auth.tokens if t.name) or "none"
            raise ValueError(
                f"rabbitmq.ingress_token {name!r} must name exactly one [[auth.tokens]] entry "
                f"({len(found)} do; token names: {named})"
            )
        return found[0]

    @property
    def egress_policy(self) -> EgressPolicy:
        """Where routes put through the API may deliver (``[egress]``, tokens or not)."""
        return self.egress.policy(authenticated=bool(self.auth.tokens))

    @property
    def db_path(self) -> Path:
        return self.store.path or self.server.data_dir / "tarry.db"

    def redacted(self) -> dict[str, Any]:
        """The effective configuration for the start-up log, with secrets hidden."""
        data = self.model_dump(mode="json")
        for token in data["auth"]["tokens"]:
            for key in ("token", "token_sha256"):
                if token[key] is not None:
                    token[key] = "***"
        data["routes"] = {name: route.redacted() for name, route in self.routes.items()}
        if data["store"]["dsn"]:
            data["store"]["dsn"] = redact_url(data["store"]["dsn"])
        data["rabbitmq"]["url"] = redact_url(data["rabbitmq"]["url"])
        return data


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> TarryConfig:
    """Defaults, then the TOML file at ``path`` (if any), then ``TARRY_*``, then ``overrides``.

    Raises ``invalid_argument`` naming the key and where it came from."""
    file_data: dict[str, Any] = {}
    if path is not None:
        try:
            file_data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise InvalidArgument(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None
    try:
        file_config = TarryConfig.model_validate(file_data) if file_data else None
    except ValidationError as exc:
        raise InvalidArgument(_describe(exc, f"config file {path}")) from None
    try:
        # The environment layers over the file: pydantic-settings reads TARRY_* here.
        env_config = TarryConfig(**(file_config.model_dump() if file_config else {}))
    except ValidationError as exc:
        raise InvalidArgument(_describe(exc, "environment (TARRY_*)")) from None
    data = _merge(env_config.model_dump(), overrides or {})
    try:
        return TarryConfig.model_validate(data)
    except ValidationError as exc:
        raise InvalidArgument(_describe(exc, "command-line flags")) from None


def _describe(exc: ValidationError, source: str) -> str:
    return f"invalid configuration in {source}: {problems(exc)}"
