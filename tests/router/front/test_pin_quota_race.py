"""Concurrent registers against one tenant's pin quota. The reproducer: 10 registers at
once against a quota of 2 names / 64 blocks gave 10 names and 520 blocks, because each
checked the quota before any of them was stored. The registers here go through the real
PrefixService to the index actor's own state (KVIndex, the class the actor wraps), with an
engine that holds every pin until all the registers have got as far as they can."""

import asyncio
import json

import pytest

from protocol.engine import PinResult
from router.cluster.index_actor import KVIndex
from router.front.pin_admin import PinQuota
from router.front.prefixes import PrefixService
from worker.openai.errors import APIError
from worker.openai.prompt import PromptBuilder
from worker.tokenizer.files import tokenizer_dir

BLOCK_SIZE = 16


class ActorHandle:
    """The index actor's methods as `.remote(...)` awaitables, like a Ray actor handle's;
    each call runs whole before the next, as on the actor's own event loop."""

    def __init__(self, index: KVIndex):
        self.index = index

    def __getattr__(self, method: str):
        fn = getattr(self.index, method)

        class Method:
            @staticmethod
            async def remote(*args):
                out = fn(*args)
                return await out if asyncio.iscoroutine(out) else out

        return Method


class GatedEngine:
    """Pins wait at the gate; `pins_waiting` counts them."""

    def __init__(self):
        self.gate = asyncio.Event()
        self.pins_waiting = 0
        self.fail_names: set[str] = set()

    async def call(self, method: str, message):
        if method != "pin_prefix":
            return None
        self.pins_waiting += 1
        await self.gate.wait()
        if message.name in self.fail_names:
            raise RuntimeError("the replica went away")
        return PinResult("r0", len(message.prompt_token_ids) // BLOCK_SIZE)


async def register_all(service, engine, names, tokens):
    """Starts every register at once; opens the gate once each is pinning or refused."""
    tasks = [asyncio.ensure_future(service.register(
        json.dumps({"name": n, "prompt": tokens}).encode(), "t", lambda model: None))
        for n in names]
    while engine.pins_waiting + sum(t.done() for t in tasks) < len(tasks):
        await asyncio.sleep(0)  # a turn of the loop for the others, not a wait for time
    engine.gate.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def make(quota: PinQuota):
    engine, index = GatedEngine(), KVIndex()
    prompts = PromptBuilder(tokenizer_dir("tiny"), "tiny", BLOCK_SIZE)
    return PrefixService(engine, ActorHandle(index), prompts, quota), engine, index


async def test_concurrent_registers_cannot_pass_the_quota_together():
    service, engine, index = make(PinQuota(max_names_per_tenant=2, max_blocks_per_tenant=64))
    tokens = list(range(3, 3 + 52 * BLOCK_SIZE))  # 52 blocks: only one fits 64
    out = await register_all(service, engine, [f"n{i}" for i in range(10)], tokens)
    ok = [o for o in out if isinstance(o, dict)]
    refused = [o for o in out if isinstance(o, APIError)]
    assert len(ok) == 1 and len(refused) == 9
    assert {(e.status_code, e.code) for e in refused} == {(429, "pin_quota_exceeded")}
    assert sum(r.num_pinned_blocks for r in index.list_prefixes("t")) == 52


async def test_names_are_counted_while_their_pins_run_and_freed_when_one_fails():
    service, engine, index = make(PinQuota(max_names_per_tenant=2, max_blocks_per_tenant=64))
    engine.fail_names = {"t/n0"}
    out = await register_all(service, engine, [f"n{i}" for i in range(10)],
                             list(range(3, 3 + 4 * BLOCK_SIZE)))
    assert isinstance(out[0], RuntimeError)  # its pin failed: its seat is given back
    assert [o["name"] for o in out if isinstance(o, dict)] == ["n1"]
    assert [r.name for r in index.list_prefixes("t")] == ["n1"]
    engine.gate = asyncio.Event()
    engine.gate.set()
    again = await service.register(json.dumps({"name": "n2", "prompt": list(
        range(3, 3 + 4 * BLOCK_SIZE))}).encode(), "t", lambda model: None)
    assert again["name"] == "n2"  # the failed register's seat is free again
    with pytest.raises(APIError, match="quota 2 names"):
        await service.register(json.dumps({"name": "n3", "prompt": [5] * 64}).encode(), "t",
                               lambda model: None)


async def test_one_name_registered_twice_at_once_is_pinned_once():
    service, engine, index = make(PinQuota(max_names_per_tenant=8, max_blocks_per_tenant=64))
    out = await register_all(service, engine, ["same"] * 3, list(range(3, 3 + 64)))
    assert [type(o) for o in out].count(dict) == 1
    assert {(o.status_code, o.code) for o in out if isinstance(o, APIError)} == {
        (409, "prefix_being_registered")}
    assert len(index.list_prefixes("t")) == 1
