"""What the gateway reads of a request it forwards: the prompt's ids and the output length."""

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from router.gateway.external_gateway import read_off_loop
from router.gateway.routed_body import chat_body, completion_body
from worker.openai.errors import APIError
from worker.openai.limits import RequestLimits
from worker.openai.prompt import PromptBuilder
from worker.tokenizer.files import tokenizer_dir


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)


def body(**kw) -> bytes:
    return json.dumps({"model": "tiny", **kw}).encode()


def test_a_completion_is_forwarded_as_received(prompts):
    raw = body(prompt="hello", max_tokens=7, logprobs=2, n=3)  # the worker judges extras
    routed = completion_body(raw, prompts, "tiny", "")
    assert routed.token_ids == prompts.encode_text("hello")
    assert routed.max_tokens == 7 * 3 and routed.body is raw  # the load of its 3 choices


def test_token_id_prompts_and_batches_route_on_the_first_prompt(prompts):
    assert completion_body(body(prompt=[5, 6, 7]), prompts, "tiny", "").token_ids == [5, 6, 7]
    assert completion_body(body(prompt=[[1, 2], [3]]), prompts, "tiny", "").token_ids == [1, 2]
    batch = completion_body(body(prompt=["ab", "cd"]), prompts, "tiny", "")
    assert batch.token_ids == prompts.encode_text("ab")
    assert completion_body(body(prompt="x"), prompts, "tiny", "").max_tokens == 16  # default
    assert batch.max_tokens == 2 * 16
    assert completion_body(body(prompt=["a"] * 64, n=2, max_tokens=3), prompts, "tiny",
                           "").max_tokens == 128 * 3


@pytest.mark.parametrize("raw, param", [
    (body(prompt=["a"] * 65, n=2), "prompt"),  # 130 sequences: over the cap of 128
    (body(prompt="a", n=129), "n"),
])
def test_the_sequence_cap_is_checked_before_forwarding(prompts, raw, param):
    with pytest.raises(APIError) as info:
        completion_body(raw, prompts, "tiny", "")
    assert (info.value.status_code, info.value.param) == (400, param)
    with pytest.raises(APIError) as info:
        chat_body(body(messages=[{"role": "user", "content": "x"}], n=129), prompts, "tiny", "")
    assert (info.value.status_code, info.value.param) == (400, "n")


@pytest.mark.parametrize("raw, status", [
    (b"{", 400), (b"[1]", 400), (body(prompt=""), 400), (body(prompt=[]), 400),
    (body(prompt=[-1]), 400), (body(prompt=[True]), 400), (body(), 400),
    (json.dumps({"model": "other", "prompt": "x"}).encode(), 404),
])
def test_bad_completions_are_refused_before_routing(prompts, raw, status):
    with pytest.raises(APIError) as info:
        completion_body(raw, prompts, "tiny", "")
    assert info.value.status_code == status


def test_a_chat_goes_through_the_template_with_text_parts_only(prompts):
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                             {"type": "image_url", "image_url": {"url": "x"}}]}]
    routed = chat_body(body(messages=messages, max_completion_tokens=3), prompts, "tiny", "")
    assert routed.token_ids == prompts.encode_chat([{"role": "user", "content": "hi"}])
    assert routed.max_tokens == 3
    for bad in ([], [{"content": "no role"}], "text"):
        with pytest.raises(APIError):
            chat_body(body(messages=bad), prompts, "tiny", "")


def test_a_tenant_salt_replaces_the_clients(prompts):
    routed = completion_body(body(prompt="x", cache_salt="mine"), prompts, "tiny", "tenant-a")
    assert json.loads(routed.body)["cache_salt"] == "tenant-a"


def test_prompt_text_is_checked_against_the_limits_before_it_is_tokenized(prompts):
    limits = RequestLimits(max_prompt_chars=10)
    for raw, param in ((body(prompt="x" * 11), "prompt"),
                       (body(prompt=["x" * 6, "y" * 5]), "prompt"),  # a batch's total
                       (body(messages=[{"role": "user", "content": "x" * 6},
                                       {"role": "user", "content": "y" * 5}]), "messages")):
        parse = chat_body if param == "messages" else completion_body
        with pytest.raises(APIError) as err:
            parse(raw, prompts, "tiny", "", limits)
        assert err.value.status_code == 400 and err.value.code == "prompt_too_long"
        assert err.value.param == param
    assert completion_body(body(prompt="x" * 10), prompts, "tiny", "", limits).token_ids
    with pytest.raises(APIError) as err:
        completion_body(body(prompt="x"), prompts, "tiny", "", RequestLimits(max_body_bytes=8))
    assert err.value.status_code == 413


def test_a_streamed_request_is_marked_to_hold_a_stream_slot(prompts):
    assert completion_body(body(prompt="x", stream=True), prompts, "tiny", "").stream
    assert not completion_body(body(prompt="x"), prompts, "tiny", "").stream
    assert chat_body(body(messages=[{"role": "user", "content": "x"}], stream=True), prompts,
                     "tiny", "").stream


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": 10**309}, "max_tokens"),  # over any context: bounded before the router
    ({"max_tokens": 1e308}, "max_tokens"), ({"max_tokens": 1.0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"), ({"max_tokens": "16"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 10**309, "max_tokens": 4}, "max_completion_tokens"),
    ({"n": 1.5}, "n"), ({"n": True}, "n"), ({"n": 0}, "n"), ({"n": "2"}, "n"),
])
def test_a_bad_or_unbounded_number_is_a_400_not_a_load(prompts, fields, param):
    for route in (lambda: completion_body(body(prompt="x", **fields), prompts, "tiny", ""),
                  lambda: chat_body(body(messages=[{"role": "user", "content": "x"}],
                                         **fields), prompts, "tiny", "")):
        with pytest.raises(APIError) as info:
            route()
        assert (info.value.status_code, info.value.param) == (400, param)


def test_max_completion_tokens_wins_and_the_output_is_bounded(prompts):
    raw = body(prompt="x", max_tokens=100, max_completion_tokens=3)
    assert completion_body(raw, prompts, "tiny", "").max_tokens == 3
    limits = RequestLimits(max_output_tokens=64)
    assert completion_body(body(prompt="x", max_tokens=64), prompts, "tiny", "",
                           limits).max_tokens == 64
    with pytest.raises(APIError):
        completion_body(body(prompt="x", max_tokens=65), prompts, "tiny", "", limits)


async def test_a_long_prompt_is_read_off_the_loop_that_serves_everyone(prompts):
    """Tokenizing a prompt at the size limit takes seconds: the external gateway reads a large
    body in a thread, so its loop keeps serving other tenants meanwhile (here: the loop
    itself must release the read, which it could not do if the read ran on it)."""
    release, threads_seen = threading.Event(), []

    def slow_read(raw, *args):
        threads_seen.append(threading.current_thread().name)
        if len(raw) > 8 * 1024 and not release.wait(30):
            raise AssertionError("the loop was blocked by the read")
        return completion_body(raw, *args)

    limits = RequestLimits()
    with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as threads:
        small = await read_off_loop(threads, slow_read, body(prompt="hi"), prompts, "tiny",
                                    "", limits)
        large_raw = body(prompt="word " * 4000)
        reading = asyncio.ensure_future(read_off_loop(threads, slow_read, large_raw,
                                                      prompts, "tiny", "", limits))
        while len(threads_seen) < 2:
            await asyncio.sleep(0)  # the loop is free while the read waits
        release.set()
        large = await reading
    assert threads_seen[0] == threading.current_thread().name  # small: inline
    assert threads_seen[1].startswith("tokenize")
    assert small.token_ids == prompts.encode_text("hi")
    assert large.token_ids == prompts.encode_text("word " * 4000)
