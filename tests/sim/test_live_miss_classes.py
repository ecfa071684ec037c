"""bench_peers' live miss classes, from a scripted event log (no workers, no ZMQ)."""

from benchmarks.peers.event_recorder import live_miss_classes, serving_workers
from benchmarks.peers.measure import prompt_token_ids
from benchmarks.simlib.openai_load import HttpRecord
from kv.hashing import block_hashes, namespace_root

MODEL = "tiny"
PROMPT = "".join(chr(40 + i) for i in range(31))  # <s> + 31 bytes: 2 full blocks


def hashes(prompt: str) -> tuple:
    return tuple(block_hashes(prompt_token_ids(prompt), 16, namespace_root(MODEL)))


def record(request_id: str, sent_s: float, cached_tokens: int = 0) -> HttpRecord:
    return HttpRecord(request_id, sent_s, first_chunk_s=sent_s + 0.1, done_s=sent_s + 0.2,
                      prompt_tokens=32, cached_tokens=cached_tokens, prompt=PROMPT)


def test_a_block_evicted_before_the_send_and_recomputed_is_evicted_everywhere():
    h = hashes(PROMPT)
    # worker 0 computes the prompt and evicts it; the same prompt later runs on worker 1,
    # whose own store (its prefill) comes after the send and before its first token
    log = [(0.05, 0, True, h), (0.5, 0, False, h), (1.05, 1, True, h)]
    shares = live_miss_classes([record("a", 0.0), record("b", 1.0)], log, 0.0, MODEL, 2)
    assert shares == {"never_seen": 0.5, "evicted_everywhere": 0.5, "not_yet_published": 0.0,
                      "elsewhere": 0.0, "here_gone": 0.0}


def test_a_block_another_worker_computes_while_the_request_waits_is_in_flight():
    h = hashes(PROMPT)
    # "b" is sent while worker 0 still computes "a" (stored at 1.08); b runs on worker 1,
    # which stores it first (at 1.03): the serving worker is the first to store after a send
    log = [(1.03, 1, True, h), (1.08, 0, True, h)]
    shares = live_miss_classes([record("a", 1.0), record("b", 1.01)], log, 0.0, MODEL, 2)
    assert shares == {"never_seen": 0.5, "evicted_everywhere": 0.0, "not_yet_published": 0.5,
                      "elsewhere": 0.0, "here_gone": 0.0}


def test_the_serving_worker_is_the_first_to_store_the_first_miss_after_the_send():
    h = hashes(PROMPT)
    # "a" runs on worker 0; "b" (sent after its eviction) on worker 1; "c" hits every
    # block it can on worker 1, stores nothing: its worker is unknown
    log = [(0.05, 0, True, h), (0.5, 0, False, h), (1.05, 1, True, h)]
    records = [record("a", 0.0), record("b", 1.0), record("c", 2.0, cached_tokens=31)]
    assert serving_workers(records, log, 0.0, MODEL) == {"a": 0, "b": 1, "c": None}
