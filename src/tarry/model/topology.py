"""The arithmetic of RabbitMQ's native delay topology (NServiceBus's design; reference §1), with
no I/O, so the transports, the CLI and the tests share one copy of it.

The broker does the waiting. Level ``L`` (0..levels−1) is a topic exchange and a queue of the same
name (``{prefix}.delay-level-NN``) whose messages live ``2^L`` s and are then dead-lettered to
level ``L−1``'s exchange (level 0's go to ``{prefix}.delay-delivery``). A message's routing key
spells its delay in binary, highest bit first, one word per bit (``1.0.1.``), followed by the
destination address. Exchange ``L`` sends a key whose bit ``L`` is 1 into its queue (wait
``2^L`` s) and a key whose bit ``L`` is 0 straight on to exchange ``L−1``; dead-lettering keeps
the routing key, so the address survives every hop and the delivery exchange routes it to the
endpoint bound with ``#.{address}``.

With the default 28 levels and the prefix ``nsb.v2`` the names, keys and arguments are exactly
those of NServiceBus.RabbitMQ 7.0+ (``DelayInfrastructure.cs``), so tarry interoperates with it;
NServiceBus's own prefixes (``NSERVICEBUS_PREFIXES``) therefore require 28 levels. The AMQP types
of the arguments and headers are the transport's concern (``transports.rabbitmq_topology``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tarry.errors import InvalidArgument

__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_PREFIX",
    "NSERVICEBUS_PREFIXES",
    "QueueType",
    "RoutingTopology",
    "Topology",
    "delay_seconds_for",
    "topic_matches",
]

#: NServiceBus uses 28 bits: the longest delay is 2^28 − 1 s (about 8.5 years).
DEFAULT_LEVELS = 28
DEFAULT_PREFIX = "tarry"
#: NServiceBus.RabbitMQ's own topologies: ``nsb.v2`` (7.0+, quorum) and ``nsb`` (before 7.0,
#: classic). Its routing keys always spell 28 bits, so these names allow no other level count.
NSERVICEBUS_PREFIXES = frozenset({"nsb.v2", "nsb"})
#: AMQP 0-9-1 routing keys are short strings.
MAX_ROUTING_KEY_BYTES = 255


class QueueType(StrEnum):
    #: Quorum queues (NServiceBus v2): replicated, and dead-lettering between levels is
    #: at-least-once (``x-dead-letter-strategy = at-least-once`` with ``reject-publish``), so a
    #: message is never lost between hops. Needs RabbitMQ ≥ 3.10.
    QUORUM = "quorum"
    #: Classic queues (NServiceBus v1): lighter, but RabbitMQ dead-letters from them without
    #: internal confirms (at most once), so a broker crash during a hop can lose a message.
    CLASSIC = "classic"


class RoutingTopology(StrEnum):
    """How an endpoint is bound to the delivery exchange: NServiceBus's routing topologies."""

    #: The endpoint's queue is bound (queue to exchange). Works for any queue.
    DIRECT = "direct"
    #: The endpoint's own exchange, named like its queue, is bound (exchange to exchange); a
    #: conventional NServiceBus endpoint declares that exchange and binds its queue to it.
    CONVENTIONAL = "conventional"


def delay_seconds_for(delay_ms: int) -> int:
    """Whole seconds of the delay, rounded **up** (1 ms → 1 s) so rounding never makes a message
    early. A due time in the past stays negative, as NServiceBus keeps it in its delay header
    (``Math.Ceiling``); the routing key then spells 0 (``routing_key`` clamps)."""
    return -(-delay_ms // 1000)


@dataclass(frozen=True, slots=True)
class Topology:
    """The names and keys of one delay topology (``prefix`` and number of ``levels``)."""

    prefix: str = DEFAULT_PREFIX
    levels: int = DEFAULT_LEVELS

    def __post_init__(self) -> None:
        if not 1 <= self.levels <= DEFAULT_LEVELS:
            raise InvalidArgument(f"levels ({self.levels}) must be between 1 and {DEFAULT_LEVELS}")
        if not self.prefix or any(c.isspace() for c in self.prefix):
            raise InvalidArgument(f"prefix {self.prefix!r} must be a non-empty word")
        if self.prefix in NSERVICEBUS_PREFIXES and self.levels != DEFAULT_LEVELS:
            raise InvalidArgument(
                f"prefix {self.prefix!r} is NServiceBus's own topology, which always has "
                f"{DEFAULT_LEVELS} levels; drop levels ({self.levels}) or choose another prefix"
            )

    # --- names ----------------------------------------------------------------------------------
    @property
    def max_delay_s(self) -> int:
        return (1 << self.levels) - 1

    @property
    def delivery_exchange(self) -> str:
        return f"{self.prefix}.delay-delivery"

    def level_name(self, level: int) -> str:
        """Exchange and queue of a level share this name: ``{prefix}.delay-level-07``."""
        return f"{self.prefix}.delay-level-{level:02d}"

    def dead_letter_exchange(self, level: int) -> str:
        return self.delivery_exchange if level == 0 else self.level_name(level - 1)

    def ttl_ms(self, level: int) -> int:
        return (1 << level) * 1000

    # --- binding keys ---------------------------------------------------------------------------
    def _stars(self, level: int) -> str:
        return "*." * (self.levels - 1 - level)

    def queue_binding_key(self, level: int) -> str:
        """Exchange L → queue L: bit L is 1 (``*.`` per higher bit, then ``1.#``)."""
        return f"{self._stars(level)}1.#"

    def pass_binding_key(self, level: int) -> str:
        """Exchange L → exchange L−1 (or the delivery exchange from level 0): bit L is 0."""
        return f"{self._stars(level)}0.#"

    @staticmethod
    def endpoint_binding_key(address: str) -> str:
        """Delivery exchange → the endpoint (NServiceBus: ``#.{address}``)."""
        return f"#.{address}"

    def queue_arguments(self, level: int, queue_type: QueueType) -> dict[str, Any]:
        """The ``x-`` arguments of level ``level``'s queue; exactly NServiceBus's for each type."""
        args: dict[str, Any] = {
            "x-message-ttl": self.ttl_ms(level),
            "x-dead-letter-exchange": self.dead_letter_exchange(level),
        }
        if queue_type is QueueType.QUORUM:
            # reject-publish is what makes RabbitMQ honour at-least-once dead-lettering.
            args.update(
                {
                    "x-queue-type": "quorum",
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                }
            )
        else:
            args["x-queue-mode"] = "lazy"
        return args

    # --- sending --------------------------------------------------------------------------------
    def check_delay(self, delay_s: int) -> int:
        """The delay the routing key spells: ``delay_s``, or 0 for a due time in the past;
        ``invalid_argument`` past the maximum."""
        if delay_s > self.max_delay_s:
            raise InvalidArgument(
                f"the delay ({delay_s} s) is longer than this topology's maximum of "
                f"{self.max_delay_s} s (2^{self.levels} - 1 s); shorten it"
            )
        return max(0, delay_s)

    def routing_key(self, delay_s: int, address: str) -> str:
        """``1.0.1.…{address}``: one word per bit, highest first; raises ``invalid_argument``
        past the maximum or when the key would not fit AMQP's 255 bytes."""
        delay_s = self.check_delay(delay_s)
        bits = "".join(
            "1." if delay_s >> bit & 1 else "0." for bit in range(self.levels - 1, -1, -1)
        )
        key = bits + address
        if len(key.encode("utf-8")) > MAX_ROUTING_KEY_BYTES:
            raise InvalidArgument(
                f"address {address!r} is too long: with the {2 * self.levels}-character delay "
                f"prefix the routing key exceeds {MAX_ROUTING_KEY_BYTES} bytes; shorten it"
            )
        return key

    def starting_level(self, delay_s: int) -> int:
        """The exchange a message is published to: its highest set bit (0 for 0 and 1 s)."""
        delay_s = self.check_delay(delay_s)
        return max(0, delay_s.bit_length() - 1)

    def address_of(self, routing_key: str) -> str:
        """The destination part of a routing key (everything after the delay bits)."""
        return routing_key[2 * self.levels :]

    def path(self, routing_key: str, start_level: int) -> list[str]:
        """The queues a message published to level ``start_level`` with ``routing_key`` waits
        in, in order, ending with the delivery exchange: a model of the broker's routing built
        from the binding keys above (tests compare it with what RabbitMQ does)."""
        hops: list[str] = []
        for level in range(start_level, -1, -1):
            if topic_matches(self.queue_binding_key(level), routing_key):
                hops.append(self.level_name(level))
            elif not topic_matches(self.pass_binding_key(level), routing_key):
                raise InvalidArgument(f"routing key {routing_key!r} matches no binding")
        hops.append(self.delivery_exchange)
        return hops


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: ``*`` is exactly one word, ``#`` zero or more words."""
    words, parts = key.split("."), pattern.split(".")

    def match(p: int, w: int) -> bool:
        while p < len(parts):
            part = parts[p]
            if part == "#":
                return any(match(p + 1, k) for k in range(w, len(words) + 1))
            if w >= len(words) or (part != "*" and part != words[w]):
                return False
            p, w = p + 1, w + 1
        return w == len(words)

    return match(0, 0)
