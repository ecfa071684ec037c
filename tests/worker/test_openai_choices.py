"""n > 1, batched prompts, logprobs, min_tokens, /tokenize, /detokenize and /version on
`kvroute engine` with the real `tiny` model (greedy decoding is a function of the prompt, so
a choice's text says which prompt it came from), through the official openai client and raw
HTTP; every body validated against the openai package's own types."""

import json

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from benchmarks.simlib.engine_workers import EngineWorker
from worker.openai.prompt import PromptBuilder
from worker.openai.tokenize import kvroute_version
from worker.tokenizer.files import tokenizer_dir

REAL_TINY_ARGS = ("--engine", "real", "--model", "tiny", "--num-blocks", "256")
GREEDY = {"temperature": 0, "ignore_eos": True}
CHAT = [{"role": "user", "content": "Name three prime numbers."}]


@pytest.fixture(scope="module")
def worker():
    w = EngineWorker.start(REAL_TINY_ARGS)
    yield w
    assert w.stop() == 0


@pytest.fixture(scope="module")
def oai(worker):
    return openai.OpenAI(base_url=worker.base_url, api_key="unused", timeout=120,
                         max_retries=0)


@pytest.fixture(scope="module")
def prompts():
    return PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)


def post(worker, path, body) -> dict:
    r = httpx.post(f"{worker.base_url}/{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def sse_bodies(worker, path, body) -> list[dict]:
    with httpx.stream("POST", f"{worker.base_url}/{path}", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def completion_chunk(body: dict) -> Completion:
    """A streamed completion chunk as openai's Completion (also its chunk type), which
    requires a finish reason that a middle chunk has as null (as OpenAI sends it): checked
    with "length" in its place, then put back."""
    filled = {**body, "choices": [{**c, "finish_reason": c["finish_reason"] or "length"}
                                  for c in body["choices"]]}
    chunk = Completion.model_validate(filled)
    for choice, raw in zip(chunk.choices, body["choices"]):
        choice.finish_reason = raw["finish_reason"]
    return chunk


def test_batched_prompts_times_n_in_openai_order(worker, oai, prompts):
    batch = ["The cat sat on the", "Rivers flow down to the sea and"]
    alone = [oai.completions.create(model="tiny", prompt=p, max_tokens=6, extra_body=GREEDY)
             .choices[0].text for p in batch]
    body = Completion.model_validate(post(worker, "completions", {
        "model": "tiny", "prompt": batch, "n": 2, "max_tokens": 6, **GREEDY}))
    assert [c.index for c in body.choices] == [0, 1, 2, 3]
    # choice p * n + j is the j-th of prompt p
    assert [c.text for c in body.choices] == [alone[0], alone[0], alone[1], alone[1]]
    assert {c.finish_reason for c in body.choices} == {"length"}
    assert body.usage.prompt_tokens == sum(len(prompts.encode_text(p)) for p in batch)
    assert body.usage.completion_tokens == 4 * 6
    # token-id prompts through the client, the same order
    ids = [prompts.encode_text(p) for p in batch]
    by_ids = oai.completions.create(model="tiny", prompt=ids, max_tokens=6, extra_body=GREEDY)
    assert [c.text for c in by_ids.choices] == alone
    assert by_ids.usage.prompt_tokens == sum(map(len, ids))


def test_n_copies_share_the_prompt_through_the_prefix_cache(oai, prompts):
    text = "A prompt long enough to fill several blocks of sixteen tokens. " * 3
    num_prompt_tokens = len(prompts.encode_text(text))
    out = oai.completions.create(model="tiny", prompt=text, n=3, max_tokens=5, seed=11,
                                 temperature=1.0)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.text for c in out.choices}) > 1  # seed + j per choice: not three copies
    # the prompt counted once; its first choice computed it (nothing cached before)
    assert out.usage.prompt_tokens == num_prompt_tokens
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    assert out.usage.completion_tokens == 15
    again = oai.completions.create(model="tiny", prompt=text, n=3, max_tokens=5, seed=11,
                                   temperature=1.0)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]


def test_chat_n_streamed_per_index_equals_the_whole_response(worker):
    body = {"model": "tiny", "messages": CHAT, "n": 2, "max_tokens": 5, **GREEDY}
    whole = ChatCompletion.model_validate(post(worker, "chat/completions", body))
    assert [c.index for c in whole.choices] == [0, 1]
    chunks = [ChatCompletionChunk.model_validate(b) for b in sse_bodies(
        worker, "chat/completions", {**body, "stream": True,
                                     "stream_options": {"include_usage": True}})]
    texts, roles, finishes = {0: "", 1: ""}, {0: [], 1: []}, {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        roles[choice.index].append(choice.delta.role)
        finishes[choice.index].append(choice.finish_reason)
    for i in (0, 1):
        assert texts[i] == whole.choices[i].message.content
        assert roles[i][0] == "assistant" and set(roles[i][1:]) <= {None}
        assert finishes[i][-1] == "length" and set(finishes[i][:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completion_logprobs_whole_and_streamed(worker):
    body = {"model": "tiny", "prompt": "Logprobs of", "max_tokens": 6, "logprobs": 3,
            **GREEDY}
    whole = Completion.model_validate(post(worker, "completions", body))
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # the 3 most likely and the sampled token, by text (byte tokens may share one)
        assert logprob <= 0 and 1 <= len(top) <= 4
        assert top[token] == logprob == max(top.values())  # greedy: the most likely
    chunks = [completion_chunk(b) for b in sse_bodies(
        worker, "completions", {**body, "stream": True})]
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert sum((s.tokens for s in streamed), []) == lp.tokens
    assert sum((s.text_offset for s in streamed), []) == lp.text_offset
    assert sum((s.token_logprobs for s in streamed), []) == pytest.approx(lp.token_logprobs)


def test_chat_logprobs_with_top_logprobs(oai):
    out = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4,
                                      logprobs=True, top_logprobs=2, extra_body=GREEDY)
    ChatCompletion.model_validate(out.model_dump())
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 4
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == entry.logprob  # greedy
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.bytes == list(entry.token.encode())
    plain = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4,
                                        extra_body=GREEDY)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == out.choices[0].message.content


def greedy_first_token(worker, oai) -> tuple[str, int]:
    """A prompt whose greedy first token's text tokenizes back to that one token, and the
    token's id (a byte token that is part of a UTF-8 character does not)."""
    for i in range(40):
        prompt = f"Stop here {i}"
        text = oai.completions.create(model="tiny", prompt=prompt, max_tokens=1, logprobs=0,
                                      extra_body=GREEDY).choices[0].logprobs.tokens[0]
        ids = post(worker, "../tokenize", {"prompt": text, "add_special_tokens": False}
                   )["tokens"]
        if len(ids) == 1 and text != "\ufffd":
            return prompt, ids[0]
    raise AssertionError("no prompt's first token round-trips")


def test_min_tokens_holds_a_stop_token_back(worker, oai):
    prompt, stop_id = greedy_first_token(worker, oai)
    extra = {**GREEDY, "stop_token_ids": [stop_id]}
    stopped = oai.completions.create(model="tiny", prompt=prompt, max_tokens=4,
                                     extra_body=extra)
    assert (stopped.choices[0].finish_reason, stopped.usage.completion_tokens) == ("stop", 1)
    held = oai.completions.create(model="tiny", prompt=prompt, max_tokens=4, logprobs=0,
                                  extra_body={**extra, "min_tokens": 3})
    assert held.usage.completion_tokens >= 3
    # the sampler did not pick it: the first token is another
    first_text = post(worker, "../detokenize", {"tokens": [stop_id]})["prompt"]
    assert held.choices[0].logprobs.tokens[0] != first_text


def test_tokenize_detokenize_and_version(worker, prompts):
    text = "Hello, kvroute!"
    out = httpx.post(f"{worker.url}/tokenize", json={"model": "tiny", "prompt": text},
                     timeout=30).json()
    assert out == {"count": len(prompts.encode_text(text)), "max_model_len": 2048,
                   "tokens": prompts.encode_text(text)}
    strs = httpx.post(f"{worker.url}/tokenize", json={"prompt": text, "return_token_strs":
                                                      True}, timeout=30).json()["token_strs"]
    assert len(strs) == out["count"]
    chat = httpx.post(f"{worker.url}/tokenize", json={"messages": CHAT}, timeout=30).json()
    assert chat["tokens"] == prompts.encode_chat(CHAT)
    back = httpx.post(f"{worker.url}/detokenize", json={"tokens": out["tokens"][1:]},
                      timeout=30).json()
    assert back == {"prompt": text}
    assert httpx.get(f"{worker.url}/version", timeout=30).json() == {
        "version": kvroute_version()}
    assert kvroute_version() != "unknown"
    for path, body, param in (("tokenize", {"prompt": 5}, "prompt"),
                              ("tokenize", {"prompt": "x", "model": "gpt"}, "model"),
                              ("detokenize", {"tokens": [-1]}, "tokens"),
                              ("detokenize", {"tokens": ["a"]}, "tokens.0")):
        r = httpx.post(f"{worker.url}/{path}", json=body, timeout=30)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "n": 129}, "n"),
    ({"prompt": [], "n": 1}, "prompt"),
    ({"prompt": ["a", [1, 2]]}, "prompt"),
    ({"prompt": [[1], []]}, "prompt"),
    ({"prompt": ["x"] * 43, "n": 3}, "prompt"),  # 129 sequences
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "min_tokens": 5, "max_tokens": 4}, "min_tokens"),
])
def test_bad_batches_and_choices_name_the_field(worker, body, param):
    r = httpx.post(f"{worker.base_url}/completions", json={"model": "tiny", **body},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


@pytest.mark.parametrize("body, param", [
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
    ({"n": 0}, "n"),
])
def test_bad_chat_choices_name_the_field(worker, body, param):
    r = httpx.post(f"{worker.base_url}/chat/completions",
                   json={"model": "tiny", "messages": CHAT, **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
