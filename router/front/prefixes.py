"""Named pinned prefixes (`/v1/prefixes`): an operator's system prompts, computed ahead on
the replica the router picks for them and kept there while pinned.

The records live in the KV index actor, so every gateway process lists and deletes the same
ones. Names are per tenant; the engine pins under "tenant/name" with the tenant's salt, so
a tenant's prefix only ever serves that tenant. When a prefix's replica dies, the index
actor offers the record to one gateway, whose `rewarm_orphans` loop pins it again on the
replica the router picks; meanwhile it lists with status "rewarming". When the index actor
restarts, the replicas report their pins to the new one, which rebuilds the records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from protocol.engine import PinRequest, PinResult, UnpinRequest
from router.cluster.pin_quota import PinQuota
from router.cluster.prefix_registry import PrefixRecord, engine_pin_name
from router.front.engine_client import EngineClient
from worker.openai.errors import APIError
from worker.openai.prompt import PromptBuilder, PromptError
from worker.openai.schema import ChatMessage, parse_body

log = logging.getLogger(__name__)


class PrefixRegisterRequest(BaseModel):
    """The body of `POST /v1/prefixes`: a name and a prompt or chat messages."""

    model_config = ConfigDict(extra="ignore")
    name: StrictStr = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    model: StrictStr | None = None
    prompt: StrictStr | list[StrictInt] | None = None
    messages: list[ChatMessage] | None = None

    @field_validator("prompt")
    @classmethod
    def _token_range(cls, v: str | list[int] | None) -> str | list[int] | None:
        if isinstance(v, list) and any(not 0 <= t < 2**32 for t in v):
            raise ValueError("token ids must be in [0, 2**32)")
        return v

    @field_validator("messages")
    @classmethod
    def _nonempty(cls, v: list[ChatMessage] | None) -> list[ChatMessage] | None:
        if v is not None and not v:
            raise ValueError("messages must not be empty")
        return v


def _body(record: PrefixRecord) -> dict[str, Any]:
    return {"object": "prefix", "name": record.name, "replica": record.replica_id or None,
            "status": "pinned" if record.replica_id else "rewarming",
            "num_prompt_tokens": record.num_prompt_tokens,
            "num_pinned_blocks": record.num_pinned_blocks}


class PrefixService:
    def __init__(self, engine: EngineClient, index: Any, prompts: PromptBuilder,
                 quota: PinQuota | None = None):
        self._engine = engine
        self._index = index
        self._prompts = prompts
        self._quota = quota or PinQuota()

    async def register(self, raw_body: bytes, tenant: str,
                       check_model: Callable[[str | None], None]) -> dict[str, Any]:
        body = parse_body(raw_body, PrefixRegisterRequest)
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send exactly one of 'prompt' or 'messages'", param="prompt",
                           code="invalid_value")
        if body.messages is not None:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            try:
                # The prefix of a conversation: no generation prompt after it.
                text = self._prompts.render_chat(messages, add_generation_prompt=False)
            except PromptError as err:
                raise APIError(400, str(err), param="messages") from None
            token_ids = self._prompts.tokenizer.encode(text, add_special_tokens=False).ids
        elif isinstance(body.prompt, str):
            token_ids = self._prompts.encode_text(body.prompt)
        else:
            token_ids = list(body.prompt)
        # The quota is checked and this prefix's share held in one call to the registry,
        # before any engine work: concurrent registers cannot pass it together.
        block_size = self._prompts.block_size
        refusal = await self._index.reserve_prefix.remote(
            tenant, body.name, len(token_ids) // block_size, block_size, self._quota)
        if refusal is not None:
            status = 409 if refusal.code == "prefix_being_registered" else 429
            raise APIError(status, refusal.message, code=refusal.code,
                           type_="rate_limit_error" if status == 429 else "invalid_request_error")
        try:
            record = await self._pin(body.name, tenant, token_ids)
        except BaseException:
            await self._index.release_prefix.remote(tenant, body.name)
            raise
        old = await self._index.put_prefix.remote(record)
        if old is not None and old.replica_id and old.replica_id != record.replica_id:
            await self._unpin(old)
        return _body(record)

    async def rewarm_orphans(self, wait_s: float = 30.0) -> None:
        """Forever: pins again the prefixes whose replica is gone, as the index actor offers
        them (to one gateway at a time). A failure leaves the prefix offered again."""
        while True:
            try:
                orphans = await self._index.claim_orphaned_prefixes.remote(wait_s)
            except Exception:  # the actor is restarting: it keeps no records across that
                log.exception("claiming orphaned prefixes failed")
                await asyncio.sleep(1.0)  # back off, not a synchronisation
                continue
            for orphan in orphans:
                try:
                    placed = await self._pin(orphan.name, orphan.tenant,
                                             list(orphan.prompt_token_ids))
                except Exception:
                    log.exception("warming prefix %s/%s again failed", orphan.tenant,
                                  orphan.name)
                    await self._index.release_claim.remote(orphan)
                    continue
                if not await self._index.place_prefix.remote(orphan, placed):
                    await self._unpin(placed)  # deleted or registered again meanwhile
                else:
                    log.info("prefix %s/%s warmed again on %s", orphan.tenant, orphan.name,
                             placed.replica_id)

    async def _pin(self, name: str, tenant: str, token_ids: list[int]) -> PrefixRecord:
        result: PinResult = await self._engine.call("pin_prefix", PinRequest(
            engine_pin_name(tenant, name), token_ids,
            self._prompts.block_hashes(token_ids, tenant), tenant))
        return PrefixRecord(name, tenant, len(token_ids), result.num_pinned_blocks,
                            result.replica_id, tuple(token_ids))

    async def _unpin(self, record: PrefixRecord) -> None:
        await self._engine.call("unpin_prefix", UnpinRequest(
            engine_pin_name(record.tenant, record.name), record.replica_id))

    async def list(self, tenant: str) -> dict[str, Any]:
        records = await self._index.list_prefixes.remote(tenant)
        return {"object": "list", "data": [_body(r) for r in records]}

    async def delete(self, name: str, tenant: str) -> dict[str, Any]:
        record = await self._index.pop_prefix.remote(tenant, name)
        if record is None:
            raise APIError(404, f"no pinned prefix named {name!r}", param="name",
                           code="prefix_not_found")
        if record.replica_id:  # a prefix being warmed again is unpinned by its warmer
            await self._unpin(record)
        return {"object": "prefix.deleted", "name": name, "deleted": True}
