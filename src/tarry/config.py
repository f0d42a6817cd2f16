"""tarry's configuration: one typed object, layered from defaults, ``tarry.toml``, ``TARRY_*``
environment variables (nested with ``__``, e.g. ``TARRY_SERVER__PORT=7421``) and CLI flags, in that
order. Components receive their own sub-object and never read the environment themselves.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from tarry.errors import InvalidArgument

__all__ = [
    "AuthConfig",
    "DispatchConfig",
    "JournalConfig",
    "RouteConfig",
    "ServerConfig",
    "StoreConfig",
    "TarryConfig",
    "TokenConfig",
    "load_config",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerConfig(_Section):
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
    log_level: str = "info"


class StoreConfig(_Section):
    engine: Literal["sqlite", "memory"] = "sqlite"
    """The delayed-message store: ``sqlite`` (durable, the embedded default) or ``memory``
    (nothing survives a restart; for tests and experiments)."""
    path: Path | None = None
    """The SQLite file; default ``<data_dir>/tarry.db``."""
    synchronous: Literal["full", "normal"] = "full"
    """``full``: every commit is fsynced before a producer hears 201 (an acknowledged message
    survives power loss). ``normal``: survives a process crash, may lose the last commits on
    power loss."""
    max_pages: int | None = Field(None, gt=0)
    """Cap on the database size in pages (testing the store breaker with a full disk)."""


class DispatchConfig(_Section):
    batch_size: int = Field(500, gt=0)
    """Most due messages fetched and released in one round."""
    lease_ms: int = Field(30_000, gt=0)
    """How long a fetched message stays claimed before another attempt may take it."""
    max_sleep_ms: int = Field(60_000, gt=0)
    """Longest the dispatcher sleeps without looking at the store (MSMQ: 1 minute)."""
    number_of_retries: int = Field(0, ge=0)
    """Delivery attempts after the first before a message goes to the error queue."""
    retry_backoff_ms: int = Field(1_000, ge=0)
    """First retry delay; doubles per attempt up to ``retry_backoff_max_ms``."""
    retry_backoff_max_ms: int = Field(60_000, ge=0)
    error_queue: str = "tarry.error"
    """Where undeliverable messages go (created on start)."""
    time_to_trigger_store_ms: int = Field(30_000, gt=0)
    time_to_trigger_fetch_ms: int = Field(30_000, gt=0)
    time_to_trigger_dispatch_ms: int = Field(30_000, gt=0)
    maximum_recovery_failures_per_second: int = Field(1, gt=0)
    expiry_sweep_ms: int = Field(250, gt=0)
    """How often expired messages are swept out of queues (receive never returns them anyway)."""


class TokenConfig(_Section):
    token: str
    name: str = ""
    send: list[str] = []
    """Glob patterns of destinations this token may send to."""
    receive: list[str] = []
    """Glob patterns of queues this token may receive from, ack and nack."""
    admin: list[str] = []
    """Glob patterns of queues, topics and policies this token may declare, change and delete."""


class AuthConfig(_Section):
    tokens: list[TokenConfig] = []


class RouteConfig(_Section):
    transport: Literal["http", "rabbitmq"]
    url: str
    """For ``http``: the URL tarry POSTs each due message to. For ``rabbitmq``: the AMQP URL."""
    timeout_ms: int = Field(5_000, gt=0)
    headers: dict[str, str] = {}
    exchange: str = ""
    routing_key: str | None = None
    mode: Literal["store", "native"] = "store"


class JournalConfig(_Section):
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
    routes: dict[str, RouteConfig] = {}
    queues: dict[str, dict[str, Any]] = {}
    """Queues declared at start: ``[queues.orders] message_ttl_ms = 60000``."""
    topics: dict[str, list[str]] = {}
    """Topics declared at start with their subscribed queues: ``[topics] news = ["a", "b"]``."""

    @field_validator("routes")
    @classmethod
    def _route_names(cls, routes: dict[str, RouteConfig]) -> dict[str, RouteConfig]:
        from tarry.model.validate import check_name

        for name in routes:
            check_name(name, field="route name")
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

    @property
    def db_path(self) -> Path:
        return self.store.path or self.server.data_dir / "tarry.db"

    def redacted(self) -> dict[str, Any]:
        """The effective configuration for the start-up log, with secrets hidden."""
        data = self.model_dump(mode="json")
        for token in data["auth"]["tokens"]:
            token["token"] = "***"
        for route in data["routes"].values():
            route["url"] = _redact_url(route["url"])
            route["headers"] = {k: "***" for k in route["headers"]}
        return data


def _redact_url(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


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
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )
    return f"invalid configuration in {source}: {problems}"
