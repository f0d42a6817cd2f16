"""Request and response shapes of api.md, for the OpenAPI document. The routes pass bodies to
the engine as they are, so the rules stay in ``tarry.model`` and are not written twice here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["body"]


class SendMessage(BaseModel):
    destination: str = Field(description="a declared queue, topic or route")
    body: str | None = Field(None, description="UTF-8 text")
    body_base64: str | None = Field(None, description="binary body, base64")
    headers: dict[str, str] | None = None
    delay_ms: int | None = Field(None, ge=0, description="at most 268,435,455,000 (2^28 - 1 s)")
    deliver_at: int | str | None = Field(None, description="epoch ms or RFC 3339; past = now")
    ttl_ms: int | None = Field(None, ge=0, description="counts from the send; >= delay_ms")
    message_id: str | None = Field(None, description="idempotency key per destination")
    correlation_id: str | None = None
    reply_to: str | None = Field(None, description="queue receiving the reports")
    report: list[Literal["expiration", "exception"]] | None = None
    on_undeliverable: Literal["dead_letter", "discard"] | None = None
    group_id: str | None = Field(None, description="refused together with a delay")
    retain: bool | None = Field(None, description="refused together with a delay")
    persistent: bool | None = None


class SendBatch(BaseModel):
    messages: list[SendMessage]


class Scheduled(BaseModel):
    id: str
    state: str
    deliver_at: int
    expires_at: int | None


class Reschedule(BaseModel):
    delay_ms: int | None = None
    deliver_at: int | str | None = None


class QueueArguments(BaseModel):
    message_ttl_ms: int | None = Field(None, ge=0)
    expires_ms: int | None = Field(None, gt=0)
    dead_letter_to: str | None = None
    max_length: int | None = Field(None, ge=0)
    overflow: Literal["drop_head", "reject_publish"] | None = None
    max_message_bytes: int | None = Field(None, gt=0)
    put_enabled: bool | None = None


class Receive(BaseModel):
    max: int = Field(1, ge=1, le=1000)
    wait_ms: int = Field(0, ge=0, le=20000)
    visibility_ms: int | None = Field(None, ge=1)


class Ack(BaseModel):
    receipts: list[str]


class Nack(Ack):
    requeue: bool = True


class PolicyDefinition(BaseModel):
    message_ttl_ms: int | None = None
    expires_ms: int | None = None
    dead_letter_to: str | None = None
    max_length: int | None = None
    overflow: Literal["drop_head", "reject_publish"] | None = None


class PolicyBody(BaseModel):
    pattern: str
    apply_to: Literal["queues"] = "queues"
    priority: int = 0
    operator: bool = False
    definition: PolicyDefinition


def body(model: type[BaseModel]) -> dict[str, Any]:
    """An ``openapi_extra`` that documents ``model`` as the JSON request body."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
