"""Value types the engine returns to its edges (the HTTP server, the AMQP ingress, the pipeline).
The types the layers below share (``MessageQuery``, ``Event``) live in ``tarry.model``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast, overload

from tarry.errors import TarryError
from tarry.model.accepted import AcceptedColumns
from tarry.model.lazy_messages import LazySequence
from tarry.model.message import Message
from tarry.model.queue_args import EffectiveQueueArgs, QueueArgs
from tarry.queues.row_messages import ReceivedRows

__all__ = ["ColumnResults", "Deliveries", "Delivery", "MayAccess", "QueueInfo", "SendResult"]

#: A permission check: does the caller's token allow this action on that name?
MayAccess = Callable[[str], bool]


# Not frozen: a batch makes one per send (see SendPlan).
@dataclass(slots=True)
class SendResult:
    """The answer to one accepted send."""

    id: str
    state: str
    deliver_at_ms: int
    expires_at_ms: int | None
    #: False when a repeated ``message_id`` matched an earlier message: nothing was stored.
    created: bool = True
    destination: str = ""
    #: For a topic: one (id, queue) per subscriber copy made at send time.
    copies: tuple[tuple[str, str], ...] = ()

    def to_public(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "state": self.state,
            "deliver_at": self.deliver_at_ms,
            "expires_at": self.expires_at_ms,
        }
        if not self.created:
            data["duplicate"] = True
        if self.copies:
            data["copies"] = [{"id": i, "queue": q} for i, q in self.copies]
        return data


class ColumnResults(Sequence[SendResult | TarryError]):
    """The answers to a batch of plain sends kept as columns (``AcceptedColumns``), in order:
    each refusal as given, and each accepted send a ``SendResult`` (created, ``state``, no
    copies), made only when one is read; ``public`` gives ``to_public`` of them all from the
    columns, with no object per send."""

    __slots__ = ("_accepted", "_made", "_refused", "_state")

    def __init__(
        self, refused: list[TarryError | None], accepted: AcceptedColumns, state: str
    ) -> None:
        #: Each send's refusal, None where ``accepted`` holds it.
        self._refused = refused
        self._accepted = accepted
        self._state = state
        self._made: list[SendResult | TarryError] | None = None

    def __len__(self) -> int:
        return len(self._refused)

    @overload
    def __getitem__(self, index: int) -> SendResult | TarryError: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[SendResult | TarryError]: ...

    def __getitem__(
        self, index: int | slice
    ) -> SendResult | TarryError | Sequence[SendResult | TarryError]:
        return self._all()[index]

    def __iter__(self) -> Iterator[SendResult | TarryError]:
        return iter(self._all())

    def public(self, refusal: Callable[[TarryError], dict[str, Any]]) -> list[dict[str, Any]]:
        """Each answer as the API shows it: ``SendResult.to_public`` of the accepted ones (a
        test holds the two to the same dicts), ``refusal`` of the refused ones."""
        c = self._accepted
        state = self._state
        answers = [
            {"id": id, "state": state, "deliver_at": due, "expires_at": expires}
            for id, due, expires in zip(c.ids, c.deliver_at_ms.tolist(), _expires(c), strict=True)
        ]
        if len(answers) == len(self._refused):
            return answers
        out: list[dict[str, Any] | None] = [
            None if error is None else refusal(error) for error in self._refused
        ]
        for row, answer in zip(c.rows, answers, strict=True):
            out[row] = answer
        return cast(list[dict[str, Any]], out)

    def _all(self) -> list[SendResult | TarryError]:
        if self._made is None:
            made: list[SendResult | TarryError | None] = list(self._refused)
            c, state = self._accepted, self._state
            for row, id, destination, due, expires in zip(
                c.rows, c.ids, c.destination, c.deliver_at_ms.tolist(), _expires(c), strict=True
            ):  # positional, in field order
                made[row] = SendResult(id, state, due, expires, True, destination)
            self._made = cast(list[SendResult | TarryError], made)
        return self._made


def _expires(columns: AcceptedColumns) -> list[int | None]:
    """Each accepted send's expiry (None: never)."""
    return [None if e < 0 else e for e in columns.expires_at_ms.tolist()]


# Not frozen: a receive makes one per message, and a frozen dataclass's __init__
# (object.__setattr__ per field) costs more than twice a plain one's.
@dataclass(slots=True)
class Delivery:
    """A message handed to a consumer by ``receive``; ``receipt`` acks or nacks it."""

    message: Message
    receipt: str

    def to_public(self) -> dict[str, Any]:
        m = self.message
        text = m.body_text
        data: dict[str, Any] = {
            "id": m.id,
            "receipt": self.receipt,
            "body": text,
            "headers": dict(m.headers),
            "deliver_at": m.deliver_at_ms,
            "expires_at": m.expires_at_ms,
            "sent_at": m.sent_at_ms,
            "message_id": m.message_id,
            "correlation_id": m.correlation_id,
            "redelivered": m.redelivered,
            "delivery_count": m.delivery_count,
            "deaths": [d.to_dict() for d in m.deaths],
        }
        if text is None:
            data["body_base64"] = m.body_base64
        return data


class Deliveries(LazySequence[Delivery]):
    """What a receive took (``ReceivedRows``) as ``Delivery``s, made only when one is read: the
    HTTP answer is written from the rows (``server.responses.received``). ``settled``: what
    the receipts the receive was given to ack came to (``{"acked", "unknown"}``, as an ack
    answers), None when it was given none."""

    __slots__ = ("settled", "taken")

    def __init__(self, taken: ReceivedRows, settled: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.taken = taken
        self.settled = settled

    def __len__(self) -> int:
        return len(self.taken)

    def __eq__(self, other: object) -> bool:
        # As the list ``receive`` answered before: equal to a list of the same deliveries.
        if isinstance(other, Deliveries | list):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def _make(self) -> list[Delivery]:
        return [Delivery(m, r) for m, r in self.taken]


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    args: QueueArgs
    effective: EffectiveQueueArgs
    ready: int
    in_flight: int
    scheduled: int
    consumers_waiting: int
    created_at_ms: int
    last_used_ms: int

    def to_public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ready": self.ready,
            "in_flight": self.in_flight,
            "scheduled": self.scheduled,
            "consumers_waiting": self.consumers_waiting,
            "arguments": self.args.to_dict(),
            "effective": self.effective.to_dict(),
            "created_at": self.created_at_ms,
            "last_used": self.last_used_ms,
        }
