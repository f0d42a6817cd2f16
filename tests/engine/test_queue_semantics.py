"""Local queues follow RabbitMQ's TTL, dead-letter, length and policy rules, and IBM MQ's
dead-letter-with-reason and reports."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from tests.engine.conftest import BOTH_STORES


@pytest.fixture(params=BOTH_STORES)
def engine_store(request: pytest.FixtureRequest) -> str:
    """Every test here runs on the embedded store and on PostgreSQL: the same queue rules."""
    return str(request.param)


async def test_an_expired_message_is_never_received_and_is_dead_lettered(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("dlq", {})
    await engine.declare_queue("q", {"dead_letter_to": "dlq"})
    sent = await engine.send({"destination": "q", "body": "x", "ttl_ms": 1000})
    clock.advance(1000)
    assert await engine.receive("q") == []  # expired: never returned, even before the sweep
    await engine.sweep()
    assert (await engine.get_message(sent.id)).state.value == "dead_lettered"
    [dead] = await engine.receive("dlq")
    assert dead.message.body == b"x"
    assert dead.message.headers["tarry-original-id"] == sent.id
    assert [d.to_dict()["reason"] for d in dead.message.deaths] == ["expired"]
    assert dead.message.deaths[0].queue == "q"
    assert dead.message.expires_at_ms is None  # the per-message expiry is removed on dead-lettering


async def test_without_a_dead_letter_target_an_expired_message_is_just_expired(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {"message_ttl_ms": 500})
    sent = await engine.send({"destination": "q", "body": "x"})
    clock.advance(500)
    await engine.sweep()
    assert (await engine.get_message(sent.id)).state.value == "expired"


async def test_the_lower_of_message_and_queue_ttl_wins(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {"message_ttl_ms": 10_000})
    short = await engine.send({"destination": "q", "body": "short", "ttl_ms": 1000})
    long = await engine.send({"destination": "q", "body": "long", "ttl_ms": 60_000})
    clock.advance(1000)
    got = [d.message.id for d in await engine.receive("q", max_messages=10, visibility_ms=1)]
    assert got == [long.id]
    clock.advance(9000)
    await engine.sweep()
    assert (await engine.get_message(short.id)).state.value == "expired"
    assert (await engine.get_message(long.id)).state.value == "expired"


async def test_queue_ttl_counts_from_arrival_and_message_ttl_from_send(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {"message_ttl_ms": 1000})
    sent = await engine.send({"destination": "q", "body": "x", "delay_ms": 5000, "ttl_ms": 5500})
    clock.advance(5000)
    await engine.dispatcher.run_once()
    message = await engine.get_message(sent.id)
    # arrived at +5000: queue TTL would end at +6000, message TTL (from send) at +5500
    assert message.queue_expires_at_ms == sent.deliver_at_ms + 500


async def test_ttl_zero_expires_on_arrival_unless_a_consumer_is_waiting(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {"message_ttl_ms": 0})
    lost = await engine.send({"destination": "q", "body": "nobody waits"})
    assert (await engine.get_message(lost.id)).state.value == "expired"

    waiting = asyncio.create_task(engine.receive("q", wait_ms=5000))
    await asyncio.sleep(0.05)
    taken = await engine.send({"destination": "q", "body": "someone waits"})
    [delivery] = await asyncio.wait_for(waiting, 5)
    assert delivery.message.id == taken.id


async def test_a_long_poll_on_an_empty_queue_returns_nothing_once_its_wait_is_over(
    make_engine,
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await engine.receive("q", wait_ms=300) == []
    assert 0.29 <= loop.time() - started < 3


async def test_drop_head_dead_letters_the_oldest_with_reason_maxlen(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("dlq", {})
    await engine.declare_queue("q", {"max_length": 2, "dead_letter_to": "dlq"})
    ids = [(await engine.send({"destination": "q", "body": str(i)})).id for i in range(3)]
    got = [d.message.id for d in await engine.receive("q", max_messages=10)]
    assert got == ids[1:]
    [dead] = await engine.receive("dlq")
    assert dead.message.headers["tarry-original-id"] == ids[0]
    assert dead.message.deaths[0].reason.value == "maxlen"


async def test_reject_publish_at_release_sends_the_message_to_the_error_queue(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {"max_length": 1, "overflow": "reject_publish"})
    delayed = await engine.send({"destination": "q", "body": "later", "delay_ms": 100})
    await engine.send({"destination": "q", "body": "fills it"})
    clock.advance(100)
    await engine.dispatcher.run_once()
    assert (await engine.get_message(delayed.id)).state.value == "dead_lettered"
    [err] = await engine.receive("tarry.error")
    assert err.message.deaths[0].reason.value == "delivery_failed"
    assert "destination_full" in err.message.headers["tarry-failure"]


async def test_a_nacked_message_is_requeued_with_its_original_expiry(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    sent = await engine.send({"destination": "q", "body": "x", "ttl_ms": 2000})
    [d] = await engine.receive("q")
    await engine.nack("q", [d.receipt], requeue=True)
    [again] = await engine.receive("q")
    assert again.message.id == sent.id and again.message.redelivered
    await engine.nack("q", [again.receipt], requeue=True)
    clock.advance(2000)
    assert await engine.receive("q") == []


async def test_a_rejected_message_is_dead_lettered_with_reason_rejected(make_engine) -> None:
    engine = await make_engine()
    await engine.declare_queue("dlq", {})
    await engine.declare_queue("q", {"dead_letter_to": "dlq"})
    await engine.send({"destination": "q", "body": "bad"})
    [d] = await engine.receive("q")
    result = await engine.nack("q", [d.receipt], requeue=False)
    assert result == {"nacked": 1, "unknown": []}
    [dead] = await engine.receive("dlq")
    assert dead.message.deaths[0].reason.value == "rejected"


async def test_an_unacked_message_comes_back_after_its_visibility_timeout(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.send({"destination": "q", "body": "x"})
    [d] = await engine.receive("q", visibility_ms=1000)
    assert await engine.receive("q") == []
    clock.advance(1000)
    [again] = await engine.receive("q")
    assert again.message.redelivered and again.receipt != d.receipt
    assert (await engine.ack("q", [d.receipt]))["unknown"] == [d.receipt]


async def test_one_ack_of_many_receipts_settles_each_message_once(make_engine, clock) -> None:
    # Given three messages received together, and one received from another queue
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.declare_queue("other", {})
    for i in range(3):
        await engine.send({"destination": "q", "body": str(i)})
    await engine.send({"destination": "other", "body": "o"})
    receipts = [d.receipt for d in await engine.receive("q", max_messages=10)]
    [theirs] = await engine.receive("other")
    assert len(set(receipts)) == 3
    # When one ack names each receipt, the first twice, the other queue's, and one never made
    result = await engine.ack("q", [*receipts, receipts[0], theirs.receipt, "nope"])
    # Then each message is acked once; the rest are unknown, in the order given
    assert result == {"acked": 3, "unknown": [receipts[0], theirs.receipt, "nope"]}
    assert (await engine.queue_info("q")).in_flight == 0
    assert (await engine.queue_info("other")).in_flight == 1
    clock.advance(60_000)
    assert await engine.receive("q") == []


async def test_a_receipt_counts_only_while_its_row_holds_it(make_engine) -> None:
    # Given two messages received one at a time, the second then held under a receipt of the
    # form made before receipts named their row (an id alone)
    engine = await make_engine()
    await engine.declare_queue("q", {})
    for body in ("a", "b"):
        await engine.send({"destination": "q", "body": body})
    [first] = await engine.receive("q")
    [second] = await engine.receive("q")
    older = "01JOLDFORMRECEIPT000000000"
    await engine.qdb.write(
        lambda conn: conn.execute(
            "UPDATE messages SET receipt = ? WHERE receipt = ?", (older, second.receipt)
        )
    )
    # When acks name the first's receive with the second's row, the second's replaced
    # receipt, and the older-form one
    forged = first.receipt.rsplit(".", 1)[0] + "." + second.receipt.rsplit(".", 1)[1]
    result = await engine.ack("q", [forged, second.receipt, older])
    # Then only the receipt the row holds acks it
    assert result == {"acked": 1, "unknown": [forged, second.receipt]}
    assert (await engine.queue_info("q")).in_flight == 1


async def test_a_receipt_naming_a_row_past_any_key_is_unknown(make_engine) -> None:
    # Given a message in flight
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.send({"destination": "q", "body": "a"})
    [held] = await engine.receive("q")
    # When an ack names its receive with a row number no key can reach, beside its receipt
    past = held.receipt.rsplit(".", 1)[0] + "." + "9" * 40
    result = await engine.ack("q", [past, held.receipt])
    # Then that receipt is unknown (not a store failure) and the message is acked
    assert result == {"acked": 1, "unknown": [past]}


async def test_a_message_back_from_its_visibility_timeout_keeps_its_place(
    make_engine, clock
) -> None:
    # Given four messages, the first taken for a minute and the second for a second
    engine = await make_engine()
    await engine.declare_queue("q", {})
    sent = [await engine.send({"destination": "q", "body": str(i)}) for i in range(4)]
    [first] = await engine.receive("q", visibility_ms=60_000)
    [second] = await engine.receive("q", visibility_ms=1000)
    assert (first.message.id, second.message.id) == (sent[0].id, sent[1].id)
    # When the second one's visibility timeout ends
    clock.advance(1000)
    info = await engine.queue_info("q")
    assert (info.ready, info.in_flight) == (3, 1)
    # Then it comes again in its old place, ahead of the ready ones; the first stays in flight
    got = await engine.receive("q", max_messages=10)
    assert [d.message.id for d in got] == [sent[1].id, sent[2].id, sent[3].id]
    assert got[0].message.redelivered and not got[1].message.redelivered
    info = await engine.queue_info("q")
    assert (info.ready, info.in_flight) == (0, 4)


async def test_the_lowest_ttl_of_argument_user_and_operator_policy_wins(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("orders.eu", {"message_ttl_ms": 60_000})
    await engine.put_policy(
        "user", {"pattern": "^orders\\.", "definition": {"message_ttl_ms": 30_000}}
    )
    await engine.put_policy(
        "ops", {"pattern": "^orders", "operator": True, "definition": {"message_ttl_ms": 10_000}}
    )
    info = await engine.queue_info("orders.eu")
    assert info.effective.message_ttl_ms == 10_000
    assert (info.effective.policy, info.effective.operator_policy) == ("user", "ops")
    sent = await engine.send({"destination": "orders.eu", "body": "x"})
    clock.advance(10_000)
    await engine.sweep()
    assert (await engine.get_message(sent.id)).state.value == "expired"


async def test_a_policy_change_reaches_messages_already_queued(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    sent = await engine.send({"destination": "q", "body": "x"})
    await engine.put_policy("short", {"pattern": "^q$", "definition": {"message_ttl_ms": 100}})
    clock.advance(100)
    await engine.sweep()
    assert (await engine.get_message(sent.id)).state.value == "expired"


async def test_an_unused_queue_is_deleted_after_expires_ms(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("tmp", {"expires_ms": 1000})
    await engine.send({"destination": "tmp", "body": "x"})
    clock.advance(999)
    await engine.sweep()
    assert "tmp" in engine.catalog.queues
    await engine.receive("tmp", visibility_ms=1)  # a receive renews the lease
    clock.advance(999)
    await engine.sweep()
    assert "tmp" in engine.catalog.queues
    clock.advance(1)
    await engine.sweep()
    assert "tmp" not in engine.catalog.queues
    assert engine.recorder.of("expired")[-1][3] == "queue_deleted"


async def test_an_expiration_report_goes_to_reply_to(make_engine, clock) -> None:
    engine = await make_engine()
    await engine.declare_queue("replies", {})
    await engine.declare_queue("q", {})
    sent = await engine.send(
        {
            "destination": "q",
            "body": "x",
            "ttl_ms": 100,
            "reply_to": "replies",
            "report": ["expiration"],
            "correlation_id": "c-1",
        }
    )
    clock.advance(100)
    await engine.sweep()
    [report] = await engine.receive("replies")
    body = orjson.loads(report.message.body)
    assert body["report"] == "expiration" and body["id"] == sent.id
    assert report.message.correlation_id == "c-1"


async def test_a_message_for_a_deleted_queue_goes_to_the_error_queue_with_an_exception_report(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("replies", {})
    await engine.declare_queue("gone", {})
    sent = await engine.send(
        {
            "destination": "gone",
            "body": "x",
            "delay_ms": 50,
            "reply_to": "replies",
            "report": ["exception"],
        }
    )
    await engine.delete_queue("gone")
    clock.advance(50)
    await engine.dispatcher.run_once()
    assert (await engine.get_message(sent.id)).state.value == "dead_lettered"
    [err] = await engine.receive("tarry.error")
    assert err.message.deaths[0].reason.value == "delivery_failed"
    [report] = await engine.receive("replies")
    assert orjson.loads(report.message.body)["report"] == "exception"


async def test_discard_drops_an_undeliverable_message_instead_of_dead_lettering(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("gone", {})
    sent = await engine.send(
        {"destination": "gone", "body": "x", "delay_ms": 50, "on_undeliverable": "discard"}
    )
    await engine.delete_queue("gone")
    clock.advance(50)
    await engine.dispatcher.run_once()
    assert (await engine.get_message(sent.id)).state.value == "dead_lettered"
    assert await engine.receive("tarry.error") == []
