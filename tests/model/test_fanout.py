"""Fan-out at send time: one message per queue, one copy per topic subscriber; a whole batch
named at once gives the same messages as one plan at a time."""

from __future__ import annotations

from dataclasses import replace

from tarry.model.fanout import fan_out, fan_out_many
from tarry.model.ids import IdGenerator, id_due_ms
from tarry.model.message import Message, Report, SendPlan, SendRequest, Undeliverable
from tarry.model.state import MessageState
from tarry.model.validate import DestinationView, TargetView

NOW = 1_800_000_000_000
VIEWS = {
    "q": DestinationView("q", "queue", (TargetView("q"),)),
    "t": DestinationView("t", "topic", (TargetView("s1"), TargetView("s2"))),
    "empty": DestinationView("empty", "topic", ()),
}


def _plan(destination: str, delay_ms: int) -> SendPlan:
    request = SendRequest(destination=destination, body=b"x", headers={"k": "v"}, message_id="m")
    return SendPlan(request, sent_at_ms=NOW, deliver_at_ms=NOW + delay_ms, expires_at_ms=None)


def test_a_batch_fans_out_as_one_plan_at_a_time_with_unique_ids_that_carry_the_due_time() -> None:
    # Given a batch of plans to a queue, a topic and a topic without subscribers
    batch = [
        (_plan(name, i * 1000), VIEWS[name]) for i in range(40) for name in ("q", "t", "empty")
    ]
    # When fanned out together and one at a time
    together = fan_out_many(batch, IdGenerator())
    alone = [fan_out(plan, view, IdGenerator().new_due) for plan, view in batch]
    # Then the messages are the same, ids aside
    assert [[replace(m, id="") for m in ms] for ms in together] == [
        [replace(m, id="") for m in ms] for ms in alone
    ]
    assert [len(ms) for ms in together[:3]] == [1, 2, 0]
    ids = [m.id for ms in together for m in ms]
    assert len(set(ids)) == len(ids) == 40 * 3
    assert all(id_due_ms(m.id) == m.deliver_at_ms for ms in together for m in ms)


def test_a_fanned_out_message_carries_every_field_of_its_send_in_its_own_place() -> None:
    # Given a send whose every field has a value of its own (the copies are built positionally)
    request = SendRequest(
        destination="t",
        body=b"body",
        headers={"k": "v"},
        message_id="mid",
        correlation_id="cid",
        reply_to="rto",
        report=frozenset({Report.EXPIRATION}),
        on_undeliverable=Undeliverable.DISCARD,
        persistent=False,
    )
    plan = SendPlan(request, sent_at_ms=NOW, deliver_at_ms=NOW + 5, expires_at_ms=NOW + 9)
    # When it is fanned out to a topic's subscriber
    (message, _) = fan_out(plan, VIEWS["t"], lambda sent, due: f"id-{sent}-{due}")
    # Then each field holds what the send said, as a message built by keywords would
    assert message == Message(
        id=f"id-{NOW}-{NOW + 5}",
        destination="s1",
        topic="t",
        body=b"body",
        headers={"k": "v"},
        sent_at_ms=NOW,
        deliver_at_ms=NOW + 5,
        expires_at_ms=NOW + 9,
        state=MessageState.SCHEDULED,
        message_id="mid",
        correlation_id="cid",
        reply_to="rto",
        report=frozenset({Report.EXPIRATION}),
        on_undeliverable=Undeliverable.DISCARD,
        persistent=False,
        updated_at_ms=NOW,
    )
    assert message.headers is not request.headers  # each copy owns its headers
