"""What a bearer token may do, name by name (``Principal``): checked when work comes in (as IBM
MQ checks authority at put time) and never again at delivery, for a request to the HTTP API
(``tarry.server.auth.principal_for``) and a message from the AMQP ingress alike. ``token`` None
means auth is off and everything is allowed.

Every name an operation touches is checked, not only the one in its path: a subscription's queue,
a queue's or a policy's ``dead_letter_to`` (send on it), a send's ``reply_to`` when it asks for
reports (send on it, per message, through ``may_send`` in the send rules), a route's
``on_failure_report_to`` (send on it, ``require_route_policy``), a subscription's queue on
unsubscribe too (admin on it), and a policy's pattern (``may_set_pattern``). Reading metadata
needs ``read`` (or ``receive``/``admin``) on the name.

What a token may see shows only names it may inspect (``may_describe``): another tenant's name
inside it (a queue's or a policy's ``dead_letter_to``, a route's ``on_failure_report_to``, the
queue of a topic's copy) reads ``***``, as a secret does, and a topic lists only the
subscriptions the token may inspect. A schedule is its destination's future messages: seeing it
needs ``read`` on its destination too, and refusals never name a destination the token may not
inspect. ``/healthz`` answers everyone, so the reasons that quote deliveries (a destination's
URL) are shown only to a token that reads every name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from tarry.config import TokenConfig
from tarry.errors import NotAuthorized, NotFound
from tarry.model.message import Message
from tarry.model.pattern_scope import literal_prefix
from tarry.model.queue_args import Policy, QueueArgs
from tarry.model.route_policy import RoutePolicy

__all__ = ["HIDDEN", "Principal"]

_GLOB_SPECIALS = frozenset("*?[")
#: A name the caller may not inspect, inside something it may see (as secrets are shown).
HIDDEN = "***"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling; ``token`` None means auth is off (loopback only)."""

    token: TokenConfig | None

    def _allows(self, patterns: list[str], name: str) -> bool:
        return self.token is None or any(fnmatchcase(name, p) for p in patterns)

    def may_send(self, name: str) -> bool:
        return self._allows(self.token.send if self.token else [], name)

    def may_receive(self, name: str) -> bool:
        return self._allows(self.token.receive if self.token else [], name)

    def may_admin(self, name: str) -> bool:
        return self._allows(self.token.admin if self.token else [], name)

    def may_read(self, name: str) -> bool:
        """Metadata, details and listings: ``read``, or ``receive``/``admin`` on the name (who
        consumes or manages a queue sees what is in it); ``send`` alone does not read."""
        return self.token is None or any(
            fnmatchcase(name, p) for p in (*self.token.read, *self.token.receive, *self.token.admin)
        )

    def may_describe(self, name: str) -> bool:
        """A destination's declaration and counts (queue and topic details, the route list):
        who may send there sees what it accepts (a pipeline checks its rows against it);
        messages and their metadata still need ``read``."""
        return self.may_read(name) or self.may_send(name)

    def may_read_message(self, message: Message) -> bool:
        """A message is readable on its queue and, for a topic's copy, on its topic."""
        return self.may_read(message.destination) or (
            message.topic is not None and self.may_read(message.topic)
        )

    @property
    def reads_all(self) -> bool:
        """May read every name: no auth, or ``"*"`` among its read/receive/admin globs."""
        if self.token is None:
            return True
        return "*" in (*self.token.read, *self.token.receive, *self.token.admin)

    @property
    def admin_of_all(self) -> bool:
        return self.token is None or "*" in self.token.admin

    def may_set_pattern(self, pattern: str) -> bool:
        """True when every queue name ``pattern`` can match lies inside this token's admin
        globs: the pattern's proven literal prefix starts with the fixed text of an admin glob
        ``text*``. Only an admin-of-all token (admin ``"*"``) may set any other pattern."""
        if self.admin_of_all:
            return True
        prefix = literal_prefix(pattern)
        if prefix is None or self.token is None:
            return False
        for glob in self.token.admin:
            fixed = glob[:-1]
            if glob.endswith("*") and not _GLOB_SPECIALS & set(fixed) and prefix.startswith(fixed):
                return True
        return False

    @property
    def _who(self) -> str:
        return (self.token.name if self.token else "") or "this token"

    def require(self, allowed: bool, action: str, name: str, *, scope: str | None = None) -> None:
        """Refuse ``action`` on ``name`` unless ``allowed``; ``scope``: the permission to ask
        for, when it is not named by ``action`` itself."""
        if not allowed:
            raise NotAuthorized(
                f"{self._who} may not {action} {name!r}; ask for a token with "
                f"{scope or action} permission on it"
            )

    def require_read(self, name: str) -> None:
        self.require(self.may_read(name), "read", name, scope="read (or receive or admin)")

    def require_describe(self, name: str) -> None:
        self.require(
            self.may_describe(name), "inspect", name, scope="send or read (or receive or admin)"
        )

    def require_reads_all(self, what: str) -> None:
        if not self.reads_all:
            raise NotAuthorized(
                f"{self._who} may not read {what}, which covers every tenant; ask for a token "
                'with read = ["*"]'
            )

    def require_dead_letter_to(self, args: QueueArgs) -> None:
        """Dead-lettering writes into ``dead_letter_to``: the token must be able to send there."""
        target = args.dead_letter_to
        if target is not None:
            self.require(self.may_send(target), "dead-letter into", target, scope="send")

    def require_route_policy(self, policy: RoutePolicy) -> None:
        """A route's failure reports write into ``on_failure_report_to`` (like ``reply_to``),
        its dead letters into ``dead_letter_to``: the token that sets the route must be able to
        send to both."""
        for target, action in (
            (policy.on_failure_report_to, "report route failures to"),
            (policy.dead_letter_to, "dead-letter route failures into"),
        ):
            if target is not None:
                self.require(self.may_send(target), action, target, scope="send")

    def require_policy(self, policy: Policy, *, action: str) -> None:
        """Set or delete ``policy``: admin on its name, a pattern inside the token's admin globs
        (``may_set_pattern``), and send on its ``dead_letter_to``."""
        self.require(self.may_admin(policy.name), f"{action} policy", policy.name, scope="admin")
        if not self.may_set_pattern(policy.pattern):
            globs = ", ".join(self.token.admin) if self.token else ""
            raise NotAuthorized(
                f"policy pattern {policy.pattern!r} may match queues outside this token's admin "
                f"globs ({globs or 'none'}); a scoped token may {action} only a pattern that "
                "starts with ^ and the fixed text of one of its globs (e.g. ^billing\\. for "
                'billing.*), any other needs a token with admin = ["*"]'
            )
        self.require_dead_letter_to(policy.definition)

    def require_subscription(self, topic: str, queue: str, *, action: str) -> None:
        """Subscribing or unsubscribing changes what ``queue`` receives: admin on both names."""
        self.require(self.may_admin(topic), f"{action} to", topic, scope="admin")
        self.require(self.may_admin(queue), action, queue, scope="admin")

    # --- what a token sees --------------------------------------------------------------------
    def shown(self, name: str | None) -> str | None:
        """``name`` as this token sees it inside something it may see: ``***`` unless it may
        inspect it."""
        return name if name is None or self.may_describe(name) else HIDDEN

    def queue_view(self, info: dict[str, Any]) -> dict[str, Any]:
        """A queue's public form (``QueueInfo.to_public``) as this token sees it: its
        dead-letter target and the policies in force on it (an admin of all may name a policy
        after another tenant)."""
        for part in ("arguments", "effective"):
            info[part] = {**info[part], "dead_letter_to": self.shown(info[part]["dead_letter_to"])}
        effective = info["effective"]
        for key in ("policy", "operator_policy"):
            effective[key] = self.shown(effective.get(key))
        return info

    def policy_view(self, policy: dict[str, Any]) -> dict[str, Any]:
        definition = policy["definition"]
        if "dead_letter_to" in definition:
            definition = {**definition, "dead_letter_to": self.shown(definition["dead_letter_to"])}
        return {**policy, "definition": definition}

    def topic_view(self, info: dict[str, Any]) -> dict[str, Any]:
        return {**info, "subscriptions": [q for q in info["subscriptions"] if self.may_describe(q)]}

    def route_view(self, route: dict[str, Any]) -> dict[str, Any]:
        """A route's public form (``RouteEntry.to_public``): its report and dead-letter
        targets as seen."""
        return {
            **route,
            "on_failure_report_to": self.shown(route.get("on_failure_report_to")),
            "dead_letter_to": self.shown(route.get("dead_letter_to")),
        }

    def sent_view(self, result: dict[str, Any]) -> dict[str, Any]:
        """A send's answer: a topic's copies keep their ids (the publisher may cancel them),
        the queues they went to are shown as seen."""
        if "copies" in result:
            result["copies"] = [{**c, "queue": self.shown(c["queue"])} for c in result["copies"]]
        return result

    def may_see_schedule(self, schedule: Mapping[str, Any]) -> bool:
        return self.may_read(str(schedule["name"])) and self.may_read(str(schedule["destination"]))

    def require_schedule(self, schedule: Mapping[str, Any], *, action: str, scope: str) -> None:
        """Read, replace or delete a stored schedule: its destination needs ``read`` to read
        it (its body is that destination's future messages) and ``send`` to replace or delete
        it (that cancels what it stored there). The refusal does not name the destination."""
        destination = str(schedule["destination"])
        allowed = self.may_read(destination) if scope == "read" else self.may_send(destination)
        if not allowed:
            raise NotAuthorized(
                f"{self._who} may not {action} schedule {schedule['name']!r}: it delivers to a "
                f"destination this token has no {scope} permission on"
            )

    def require_message_owner(self, message: Message) -> None:
        """Cancel or reschedule ``message``: send on its topic or destination. A message the
        token may not read is answered as missing, as ``GET`` answers it (a refusal would tell
        that the id is in use, and where)."""
        owner = message.topic or message.destination
        if self.may_send(owner):
            return
        if not self.may_read_message(message):
            raise NotFound(f"no message with id {message.id}")
        raise NotAuthorized(f"{self._who} may not change messages for {owner!r}")
