"""The journal's lines (format: ``tarry.journal.writer``) for a batch of events, in one pass.

Each line is the JSON object ``orjson.dumps`` makes of the line's keys in order, byte for byte,
filled into one template: a dict per event and an ``orjson`` call per line cost more than the
line. Strings that repeat across a batch (event, destination, queue, reason) are encoded once a
batch; the others through ``orjson`` (the same escaping as the dict's).

A run (``EventRun``: one change at one time for many messages) has its event, time, node,
queue and reason written into its templates once; a message with no optional field set (the
common send) makes its line as one f-string of the values that differ per message (a bytes
``%`` template costs more: it parses its format for every line), and the next message of the
same times and size takes that line's text after the id as it is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tarry.model.accepted import AcceptedColumns, ColumnMessages
from tarry.model.events import Event, EventRun
from tarry.model.lazy_messages import LazyMessages, PlainLines
from tarry.model.message import Message

__all__ = ["LATE_EVENTS", "encode_lines"]

#: Events whose line carries ``lateness_ms`` (time - deliver_at).
LATE_EVENTS = frozenset({"released", "delivered", "received", "expired"})

_LINE = (
    b'{"event":%s,"time":%d,"node":%s,"id":%s,"destination":%s,"topic":%s,"queue":%s,'
    b'"message_id":%s,"correlation_id":%s,"sent_at":%d,"deliver_at":%d,"expires_at":%s,'
    b'"size":%d,"failures":%d,"reason":%s,"lateness_ms":%s}\n'
)
_NULL = b"null"
_ID = attrgetter("id")


def encode_lines(events: Sequence[Event], node: str) -> tuple[bytes, int, int]:
    """(the lines of ``events``, how many, how many were dropped). An event that cannot be
    encoded (a value of the wrong type, text that is not valid Unicode) is dropped alone."""
    if isinstance(events, EventRun):
        return _encode_run(events, node)
    return _encode_events(events, node)


def _encode_events(events: Sequence[Event], node: str) -> tuple[bytes, int, int]:
    """``encode_lines`` of any events, a line at a time."""
    dumps = orjson.dumps
    # Per batch, so names seen once (a topic per message) never build up across batches.
    known: dict[str | None, bytes] = {None: _NULL}
    get = known.get
    node_json = dumps(node)
    late = LATE_EVENTS
    lines: list[bytes] = []
    append = lines.append
    dropped = 0
    for event, message, time_ms, queue, reason in events:
        try:
            destination, topic = message.destination, message.topic
            message_id, correlation_id = message.message_id, message.correlation_id
            expires_at_ms, deliver_at_ms = message.expires_at_ms, message.deliver_at_ms
            append(
                _LINE
                % (
                    get(event) or known.setdefault(event, dumps(event)),
                    time_ms,
                    node_json,
                    dumps(message.id),
                    get(destination) or known.setdefault(destination, dumps(destination)),
                    get(topic) or known.setdefault(topic, dumps(topic)),
                    get(queue) or known.setdefault(queue, dumps(queue)),
                    _NULL if message_id is None else dumps(message_id),
                    _NULL if correlation_id is None else dumps(correlation_id),
                    message.sent_at_ms,
                    deliver_at_ms,
                    _NULL if expires_at_ms is None else b"%d" % expires_at_ms,
                    len(message.body),
                    message.failures,
                    get(reason) or known.setdefault(reason, dumps(reason)),
                    b"%d" % (time_ms - deliver_at_ms) if event in late else _NULL,
                )
            )
        except Exception:
            dropped += 1
    return b"".join(lines), len(lines), dropped


def _fixed(json: bytes) -> bytes:
    """JSON text written into a template: its ``%`` signs kept as they are."""
    return json.replace(b"%", b"%%")


def _encode_run(run: EventRun, node: str) -> tuple[bytes, int, int]:
    """``encode_lines`` of a run: the same lines, the run's own values in the templates."""
    messages = run.messages
    if not messages:
        return b"", 0, 0
    columns = messages.columns if isinstance(messages, ColumnMessages) else None
    plain = messages.plain_lines() if isinstance(messages, LazyMessages) else None
    try:
        if columns is not None:
            first = columns.destination[0]
        elif plain is not None:
            first = plain.destination
        else:
            first = messages[0].destination
        templates = _templates(run.event, node, run.queue, run.reason, first)
    except Exception:  # a value of the run's templates cannot be encoded: each line alone
        return _encode_events(run, node)
    late = run.event in LATE_EVENTS
    time_ms = run.time_ms
    if columns is not None and not late:
        return _encode_columns(columns, time_ms, templates)
    if plain is not None and (text := _plain_lines(plain, time_ms, late, templates)):
        return text, len(plain.ids), 0
    try:
        bare = "".join(map(_ID, messages)).encode().isalnum()
    except Exception:  # an id that is not text: each line finds out alone
        bare = False
    lines, dropped = _text_lines(messages, time_ms, late, first, templates, bare)
    return "".join(lines).encode(), len(lines), dropped


def _text_lines(
    messages: Sequence[Message],
    time_ms: int,
    late: bool,
    first: str,
    templates: _Templates,
    bare: bool,
) -> tuple[list[str], int]:
    """The lines of ``_encode_run`` as text, the plain ones each one f-string (``bare``: every
    id is ASCII letters and digits, so its JSON is itself in quotes): a bytes ``%`` template
    parses its format and makes an object per value, for every line. A message with an
    optional field set, or a time that is not an ``int`` (whose text ``%d`` would write
    otherwise), takes the ``general`` template."""
    head, after_time, after_id, after_sent, after_due, tail = templates.plain_parts
    before_id = f"{head}{time_ms}{after_time}"
    if bare:
        before_id, after_id = f'{before_id}"', f'"{after_id}'
    # ``f"{time_ms}"`` is ``b"%d" % time_ms`` only for an ``int``.
    timed = type(time_ms) is int
    general = templates.general
    dumps = orjson.dumps
    known: dict[str | None, bytes] = {None: _NULL}
    get = known.get
    # A plain line's text after its id, cut from it when the next has the same times and
    # size: a run's messages come mostly in due order, and a batch's share their send time.
    line, line_id, rest = "", "", None
    last_due: int | None = None
    last_sent: int | None = None
    last_size: int | None = None
    lines: list[str] = []
    append = lines.append
    dropped = 0
    for message in messages:
        try:
            sent, due = message.sent_at_ms, message.deliver_at_ms
            if (
                timed
                and type(sent) is int
                and type(due) is int
                and message.message_id is None
                and message.correlation_id is None
                and message.expires_at_ms is None
                and message.topic is None
                and not message.failures
                and message.destination == first
            ):
                id = message.id if bare else dumps(message.id).decode()
                size = len(message.body)
                if due == last_due and sent == last_sent and size == last_size:
                    if rest is None:
                        rest = line[len(before_id) + len(line_id) :]
                    append(f"{before_id}{id}{rest}")
                    continue
                last_due = due
                last_sent = sent
                last_size = size
                line_id = id
                rest = None
                if late:
                    line = (
                        f"{before_id}{id}{after_id}{sent}{after_sent}{due}{after_due}{size}"
                        f"{tail}{time_ms - due}}}\n"
                    )
                else:
                    line = (
                        f"{before_id}{id}{after_id}{sent}{after_sent}{due}{after_due}{size}{tail}"
                    )
                append(line)
                continue
            destination, topic = message.destination, message.topic
            message_id, correlation_id = message.message_id, message.correlation_id
            expires_at_ms = message.expires_at_ms
            values = (
                time_ms,
                dumps(message.id),
                get(destination) or known.setdefault(destination, dumps(destination)),
                get(topic) or known.setdefault(topic, dumps(topic)),
                _NULL if message_id is None else dumps(message_id),
                _NULL if correlation_id is None else dumps(correlation_id),
                sent,
                due,
                _NULL if expires_at_ms is None else b"%d" % expires_at_ms,
                len(message.body),
                message.failures,
            )
            encoded = general % (*values, time_ms - due) if late else general % values
            append(encoded.decode())
        except Exception:
            dropped += 1
    return lines, dropped


def _plain_lines(
    plain: PlainLines, time_ms: int, late: bool, templates: _Templates
) -> bytes | None:
    """``_encode_run``'s lines of a batch of plain messages read as columns (``PlainLines``: a
    release, a receive, an ack), one f-string each, no ``Message`` made. None when an id is
    not bare letters and digits, or the time not an ``int`` (the general way tells each)."""
    ids = plain.ids
    if type(time_ms) is not int or not "".join(ids).encode().isalnum():
        return None
    head, after_time, after_id, after_sent, after_due, tail = templates.plain_parts
    before, after = f'{head}{time_ms}{after_time}"', f'"{after_id}'
    if plain.message_ids is not None or plain.correlation_ids is not None:
        ids = _with_producer_ids(ids, plain.message_ids, plain.correlation_ids, after)
        after = after[after.rindex(_NO_PRODUCER_IDS) + len(_NO_PRODUCER_IDS) :]
    columns = zip(ids, plain.sent_at_ms, plain.deliver_at_ms, plain.sizes, strict=True)
    if late:
        lines = [
            f"{before}{id}{after}{sent}{after_sent}{due}{after_due}{size}{tail}{time_ms - due}}}\n"
            for id, sent, due, size in columns
        ]
    else:
        lines = [
            f"{before}{id}{after}{sent}{after_sent}{due}{after_due}{size}{tail}"
            for id, sent, due, size in columns
        ]
    return "".join(lines).encode()


#: What the plain template writes of a message without its producer's ids.
_NO_PRODUCER_IDS = '"message_id":null,"correlation_id":null'


def _with_producer_ids(
    ids: Sequence[str],
    message_ids: Sequence[str | None] | None,
    correlation_ids: Sequence[str | None] | None,
    after: str,
) -> list[str]:
    """Each id with what the plain template writes after it up to its producer's ids and
    their JSON: the lines' text in the id's place, for messages sent with them."""
    to_ids = after[: after.rindex(_NO_PRODUCER_IDS)]
    none = repeat(None)
    return [
        f'{id}{to_ids}"message_id":{_json(mid)},"correlation_id":{_json(cid)}'
        for id, mid, cid in zip(
            ids,
            none if message_ids is None else message_ids,
            none if correlation_ids is None else correlation_ids,
            strict=False,  # ``repeat``: as long as the ids
        )
    ]


def _json(text: str | None) -> str:
    return "null" if text is None else orjson.dumps(text).decode()


def _encode_columns(
    columns: AcceptedColumns, time_ms: int, templates: _Templates
) -> tuple[bytes, int, int]:
    """``_encode_run``'s lines of plain sends kept as columns (``ColumnMessages``), from the
    columns: no ``Message`` is made for them."""
    first = columns.destination[0]
    message_ids, correlation_ids = columns.message_id, columns.correlation_id
    if (
        message_ids is None
        and correlation_ids is None
        and all(map(first.__eq__, columns.destination))
        and not bool((columns.expires_at_ms >= 0).any())
    ):
        return _plain_columns(columns, time_ms, templates.plain_parts), len(columns), 0
    plain, general = templates.plain, templates.general
    dumps = orjson.dumps
    known: dict[str, bytes] = {}
    get = known.get
    sent = columns.sent_at_ms
    lines: list[bytes] = []
    append = lines.append
    dropped = 0
    for id, destination, body, due, expires_at, message_id, correlation_id in zip(
        columns.ids,
        columns.destination,
        columns.body,
        columns.deliver_at_ms.tolist(),
        columns.expires_at_ms.tolist(),
        repeat(None) if message_ids is None else message_ids,
        repeat(None) if correlation_ids is None else correlation_ids,
        strict=False,  # ``repeat``: as long as the others
    ):
        try:
            if (
                expires_at < 0
                and destination == first
                and message_id is None
                and correlation_id is None
            ):
                append(plain % (time_ms, dumps(id), sent, due, len(body)))
                continue
            values = (
                time_ms,
                dumps(id),
                get(destination) or known.setdefault(destination, dumps(destination)),
                _NULL,
                _NULL if message_id is None else dumps(message_id),
                _NULL if correlation_id is None else dumps(correlation_id),
                sent,
                due,
                _NULL if expires_at < 0 else b"%d" % expires_at,
                len(body),
                0,
            )
            append(general % values)
        except Exception:
            dropped += 1
    return b"".join(lines), len(lines), dropped


def _plain_columns(columns: AcceptedColumns, time_ms: int, parts: tuple[str, ...]) -> bytes:
    """The ``plain`` template's line of every row, all to the first destination and none
    expiring, joined by Arrow a column at a time (``parts``: the template's text around its
    five values): no Python step per line."""
    head, after_time, after_id, after_sent, after_due, tail = parts
    n = len(columns)
    # Tarry's ids are letters and digits (``IdGenerator``): their JSON is the id in quotes.
    lines = pc.binary_join_element_wise(
        f'{head}{time_ms}{after_time}"',
        pa.array(columns.ids, pa.string()),
        f'"{after_id}{columns.sent_at_ms}{after_sent}',
        pa.array(columns.deliver_at_ms).cast(pa.string()),
        after_due,
        pa.array(np.fromiter(map(len, columns.body), np.int64, n)).cast(pa.string()),
        tail,
        "",
    )
    _, offsets, data = lines.buffers()
    end = int(np.frombuffer(offsets, np.int32)[lines.offset + n])
    text: bytes = data.slice(0, end).to_pybytes()
    return text


@dataclass(frozen=True, slots=True)
class _Templates:
    """A run's line templates, its time the first value of each and the message's after it:
    ``plain`` for a message with no optional field set, to the run's first destination, and
    the text around its five values (time, id, sent, due, size) in ``plain_parts``;
    ``general`` for any other. A run of an event whose lines carry ``lateness_ms`` has its
    lateness and ``}\\n`` after ``plain_parts``."""

    plain: bytes
    general: bytes
    plain_parts: tuple[str, ...]


#: ``_templates`` by (event, node, queue, reason, first destination): a release round makes a
#: run or two, each of a few messages, and building a run's templates cost about as much as
#: its lines. Few keys repeat (an event of a queue, a node); emptied when it grows past
#: ``_TEMPLATES_KEPT`` (queues or reasons made on the fly).
_TEMPLATE_CACHE: dict[tuple[str, str, str | None, str | None, str], _Templates] = {}
_TEMPLATES_KEPT = 1024


def _templates(
    event: str, node: str, queue: str | None, reason: str | None, first: str
) -> _Templates:
    """A run's line templates (``_Templates``)."""
    key = (event, node, queue, reason, first)
    got = _TEMPLATE_CACHE.get(key)
    if got is not None:
        return got
    dumps = orjson.dumps
    late = event in LATE_EVENTS
    head = b'{"event":' + _fixed(dumps(event)) + b',"time":%d,"node":' + _fixed(dumps(node))
    head += b',"id":'
    queue_json = _fixed(dumps(queue))
    tail = _fixed(dumps(reason)) + (b',"lateness_ms":%d}\n' if late else b',"lateness_ms":null}\n')
    general = (
        head + b'%s,"destination":%s,"topic":%s,"queue":' + queue_json
        + b',"message_id":%s,"correlation_id":%s,"sent_at":%d,"deliver_at":%d,'
        b'"expires_at":%s,"size":%d,"failures":%d,"reason":' + tail
    )  # fmt: skip
    # The plain template's text around its values, as written: (time, id, sent, due, size).
    parts = (
        b'{"event":' + dumps(event) + b',"time":',
        b',"node":' + dumps(node) + b',"id":',
        b',"destination":' + dumps(first) + b',"topic":null,"queue":' + dumps(queue)
        + b',"message_id":null,"correlation_id":null,"sent_at":',
        b',"deliver_at":',
        b',"expires_at":null,"size":',
        b',"failures":0,"reason":' + dumps(reason) + b',"lateness_ms":',
    )  # fmt: skip
    values = (b"%d", b"%s", b"%d", b"%d", b"%d", b"%d}\n" if late else b"null}\n")
    plain = b"".join(_fixed(part) + value for part, value in zip(parts, values, strict=True))
    made = _Templates(
        plain,
        general,
        (*(part.decode() for part in parts[:-1]), parts[-1].decode() + ("" if late else "null}\n")),
    )
    if len(_TEMPLATE_CACHE) >= _TEMPLATES_KEPT:
        _TEMPLATE_CACHE.clear()
    _TEMPLATE_CACHE[key] = made
    return made
