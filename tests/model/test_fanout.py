"""Fan-out at send time: one message per queue, one copy per topic subscriber; a whole batch
named at once gives the same messages as one plan at a time."""

from __future__ import annotations

from dataclasses import replace

from tarry.model.fanout import fan_out, fan_out_many
from tarry.model.ids import IdGenerator, id_due_ms
from tarry.model.message import SendPlan, SendRequest
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
