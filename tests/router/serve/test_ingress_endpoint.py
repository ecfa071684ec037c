"""The ingress request router's body -> RouteCall step (tenant, tokens, block hashes)."""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from router.front.tenants import TenantAuth
from router.serve.ingress_endpoint import _read_body, call_of
from router.serve.route_calls import RouteCalls as _RouteCalls
from worker.openai.prompt import PromptBuilder
from worker.openai.schema import DEFAULT_MAX_TOKENS
from worker.tokenizer.files import tokenizer_dir

MAX_MODEL_LEN = 2048


def RouteCalls(prompts, auth, max_model_len=MAX_MODEL_LEN):  # noqa: N802 (reads as the class)
    return _RouteCalls(prompts, auth, max_model_len)


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(tokenizer_dir("tiny"), "tiny", 4)


def _body(**fields) -> bytes:
    return json.dumps({"model": "tiny", **fields}).encode()


def test_a_completion_routes_on_its_tokens_and_hashes(prompts):
    calls = RouteCalls(prompts, TenantAuth({}))
    call = calls.of(_body(prompt="hello there, router", max_tokens=7), None)
    ids = prompts.encode_text("hello there, router")
    assert call.prompt_token_ids == ids
    assert call.block_hashes == prompts.block_hashes(ids)
    assert len(call.block_hashes) == len(ids) // 4
    assert call.max_tokens == 7
    ids_call = calls.of(_body(prompt=[40, 41, 42, 43, 44]), None)
    assert ids_call.prompt_token_ids == [40, 41, 42, 43, 44]
    assert ids_call.max_tokens == DEFAULT_MAX_TOKENS
    assert ids_call.route_id != call.route_id


def test_a_batch_routes_on_its_first_prompt(prompts):
    calls = RouteCalls(prompts, TenantAuth({}))
    text_batch = calls.of(_body(prompt=["first of two", "second"], n=2), None)
    assert text_batch.prompt_token_ids == prompts.encode_text("first of two")
    assert text_batch.max_tokens == 2 * 2 * DEFAULT_MAX_TOKENS  # the load of 4 choices
    assert text_batch.num_sequences == 4  # each charged as a completion
    chat = calls.of(_body(messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=5),
                    None)
    assert (chat.max_tokens, chat.num_sequences) == (15, 3)
    assert calls.of(_body(prompt=[[7, 8, 9], [1]]), None).prompt_token_ids == [7, 8, 9]


def test_a_chat_routes_on_its_templated_tokens(prompts):
    messages = [{"role": "user", "content": "which replica?"}]
    call = RouteCalls(prompts, TenantAuth({})).of(_body(messages=messages, max_tokens=3), None)
    assert call.prompt_token_ids == prompts.encode_chat(messages)
    assert call.max_tokens == 3


def test_the_tenant_of_the_key_names_the_hash_namespace(prompts):
    calls = RouteCalls(prompts, TenantAuth({"key-a": "tenant-a"}))
    call = calls.of(_body(prompt="the same prompt text"), "Bearer key-a")
    ids = prompts.encode_text("the same prompt text")
    assert call.block_hashes == prompts.block_hashes(ids, "tenant-a")
    assert call.block_hashes != prompts.block_hashes(ids)


@pytest.mark.parametrize("body,authorization", [
    (b"not json", None),
    (_body(prompt="x", max_tokens=-1), None),  # the replica answers the 400
    (_body(prompt=""), None),
    (_body(messages=[]), None),
    (_body(prompt=[]), None),
    (_body(prompt=[[]]), None),
    (_body(prompt="hello"), "Bearer wrong-key"),  # the replica answers the 401
])
def test_a_body_it_cannot_route_gets_no_call(prompts, body, authorization):
    calls = RouteCalls(prompts, TenantAuth({"key-a": "tenant-a"}) if authorization
                       else TenantAuth({}))
    assert calls.of(body, authorization) is None


# ---- what a hostile body can do to the router's load: nothing it would not do as work ----

@pytest.mark.parametrize("fields", [
    {"max_tokens": 10**309},  # an int no float holds: OverflowError in the policy
    {"max_tokens": 1e308},  # a float: the replica refuses it
    {"max_tokens": 10**9},  # an int over the context: hours of load
    {"max_tokens": MAX_MODEL_LEN + 1},
    {"max_tokens": True}, {"max_tokens": "16"}, {"max_tokens": 0}, {"max_tokens": 1.5},
    {"max_completion_tokens": 10**309, "max_tokens": 4},
    {"n": 10**9}, {"n": 129}, {"n": 1.5}, {"n": True}, {"n": 0},
    {"prompt": ["a"] * 65, "n": 2},  # 130 sequences: over the cap of 128
    {"prompt": [2**40]},  # a token id no block hash takes: OverflowError
    {"prompt": [7, -1]},
    {"prompt": [1] * (MAX_MODEL_LEN + 1)},  # longer than the context
    {"prompt": [1] * (MAX_MODEL_LEN - 4), "max_tokens": 5},  # prompt + output over it
])
def test_a_body_the_replica_refuses_charges_no_replica(prompts, fields):
    calls = RouteCalls(prompts, TenantAuth({}))
    assert calls.of(_body(**{"prompt": "hello", **fields}), None) is None
    if "prompt" not in fields:
        messages = [{"role": "user", "content": "hello"}]
        assert calls.of(_body(messages=messages, **fields), None) is None


def test_the_largest_charge_is_the_context_times_the_sequence_cap(prompts):
    calls = RouteCalls(prompts, TenantAuth({}))
    call = calls.of(_body(prompt=["ab"] * 64, n=2, max_tokens=MAX_MODEL_LEN - 8), None)
    assert call.max_tokens == 128 * (MAX_MODEL_LEN - 8)


def test_max_completion_tokens_wins_as_the_replica_reads_it(prompts):
    calls = RouteCalls(prompts, TenantAuth({}))
    assert calls.of(_body(prompt="x", max_tokens=100, max_completion_tokens=3),
                    None).max_tokens == 3
    chat = calls.of(_body(messages=[{"role": "user", "content": "x"}], max_tokens=100,
                          max_completion_tokens=3, n=2), None)
    assert chat.max_tokens == 6


def test_text_that_cannot_fit_the_context_is_refused_without_tokenizing(prompts, monkeypatch):
    calls = RouteCalls(prompts, TenantAuth({}), max_model_len=64)
    encoded = []
    monkeypatch.setattr(prompts, "_encode", lambda text, **kw: encoded.append(text) or [1])
    too_long = "a" * (64 * calls.context.max_token_chars + 1)
    assert calls.of(_body(prompt=too_long), None) is None
    assert calls.of(_body(prompt=["b", too_long]), None) is None  # any prompt of a batch
    assert calls.of(_body(messages=[{"role": "user", "content": too_long}]), None) is None
    assert encoded == []
    assert calls.of(_body(prompt="a" * 8), None) is not None and encoded == ["a" * 8]


async def test_a_long_prompt_is_read_off_the_event_loop(prompts):
    calls = RouteCalls(prompts, TenantAuth({}), max_model_len=1 << 20)
    text = "".join(f"word{i} " for i in range(20_000))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(tick())
    await asyncio.sleep(0)
    with ThreadPoolExecutor(1) as threads:
        before = ticks
        call = await call_of(calls, threads, _body(prompt=text), None)
        during = ticks - before
        assert await call_of(calls, threads, None, None) is None  # over the size cap
    ticker.cancel()
    assert call.prompt_token_ids == prompts.tokenizer.encode(text).ids  # the same ids
    assert during > 0  # the loop went on while it was tokenized


async def test_the_route_endpoint_stops_reading_a_body_over_the_cap():
    chunks = [b"1234", b"5678", b"9abc"]
    received = []

    async def receive() -> dict:
        received.append(chunks[len(received)])
        return {"type": "http.request", "body": received[-1], "more_body": True}

    assert await _read_body(receive, max_bytes=6) is None
    assert len(received) == 2  # not read further


def test_a_chat_body_is_scanned_and_parsed_once(prompts, monkeypatch):
    """The shape scan and the parse of a large chat body run once (they ran twice: the
    routers' read, then the engine schema's own on the same bytes), and the schema still
    refuses what the replica would."""
    import msgspec

    import worker.openai.limits as limits

    counts = {"scans": 0, "parses": 0}
    scan, decoder = limits.json_shape, limits._DECODER

    class CountingDecoder:
        def decode(self, raw):
            counts["parses"] += 1
            return decoder.decode(raw)

    def counting_scan(raw):
        counts["scans"] += 1
        return scan(raw)

    monkeypatch.setattr(limits, "json_shape", counting_scan)
    monkeypatch.setattr(limits, "_DECODER", CountingDecoder())
    messages = [{"role": "user", "content": f"turn {i}"} for i in range(1000)]  # ~30 KiB
    calls = RouteCalls(prompts, TenantAuth({}), max_model_len=32_768)
    call = calls.of(_body(messages=messages, max_tokens=3), None)
    assert call.prompt_token_ids == prompts.encode_chat(messages)
    assert counts == {"scans": 1, "parses": 1}
    refused = _body(messages=messages, max_tokens=3, temperature=-1)  # the schema's 400
    assert calls.of(refused, None) is None
    assert isinstance(decoder, msgspec.json.Decoder)
