"""The model runner against Hugging Face transformers on tiny random checkpoints."""

from __future__ import annotations

import pytest
import torch

from tests.worker.model.model_harness import (
    BLOCK_SIZE,
    CONFIGS,
    hf_logits,
    load_hf,
    make_runner,
    prompt,
    seq,
    step,
)
from worker.executor.forward_batch import build_forward_batch
from worker.model.random_checkpoint import write_random_checkpoint

ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """name -> (checkpoint dir, HF model), each written once per module."""
    cache = {}

    def get(name: str):
        if name not in cache:
            path = write_random_checkpoint(tmp_path_factory.mktemp(name), CONFIGS[name], seed=0)
            cache[name] = (path, load_hf(path))
        return cache[name]

    return get


def shuffled_blocks(num_blocks: int, seed: int, limit: int = 48) -> list[int]:
    perm = torch.randperm(limit, generator=torch.Generator().manual_seed(seed))
    return perm[:num_blocks].tolist()


@pytest.mark.parametrize("name", ["llama", "llama3", "qwen2", "mistral"])
def test_prompt_logits_match_hf(checkpoint, name):
    path, hf = checkpoint(name)
    runner = make_runner(path)
    tokens = prompt(11, seed=1)
    logits = runner.execute(step(seq("a", tokens, 0, shuffled_blocks(3, seed=2))))
    assert logits.shape == (1, 300) and logits.dtype == torch.float32
    torch.testing.assert_close(logits[0], hf_logits(hf, tokens)[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["llama", "qwen2", "llama3"])
def test_greedy_decode_matches_hf_generate(checkpoint, name):
    path, hf = checkpoint(name)
    runner = make_runner(path)
    tokens, num_new = prompt(9, seed=3), 14
    blocks = shuffled_blocks(-(-(9 + num_new) // BLOCK_SIZE), seed=4)
    out = [int(runner.execute(step(seq("a", tokens, 0, blocks)))[0].argmax())]
    while len(out) < num_new:
        pos = len(tokens) + len(out) - 1
        out.append(int(runner.execute(step(seq("a", [out[-1]], pos, blocks)))[0].argmax()))
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([tokens]), max_new_tokens=num_new, do_sample=False, min_new_tokens=0
        )[0, len(tokens) :].tolist()
    assert out == expected


def test_chunked_prefill_across_block_boundaries(checkpoint):
    path, hf = checkpoint("llama")
    runner = make_runner(path)
    tokens = prompt(13, seed=5)
    blocks = shuffled_blocks(4, seed=6)
    expected = hf_logits(hf, tokens)
    # chunks end at positions 2, 7 (k*B - 1), 11 (k*B - 1) and 12 (k*B): starts 3, 8, 12
    start = 0
    for size in (3, 5, 4, 1):
        chunk = tokens[start : start + size]
        logits = runner.execute(step(seq("a", chunk, start, blocks)))
        torch.testing.assert_close(logits[0], expected[start + size - 1], atol=ATOL, rtol=0)
        start += size


def test_ragged_batch_equals_each_alone(checkpoint):
    path, hf = checkpoint("qwen2")
    runner = make_runner(path)
    prompts = {"a": prompt(5, 7), "b": prompt(12, 8), "c": prompt(1, 9), "d": prompt(8, 10)}
    blocks = {"a": [0, 1, 2], "b": [3, 4, 5, 6], "c": [7, 8], "d": [9, 10, 11]}
    # step 1: four prefills of lengths 5, 12, 1, 8 in one batch; "c" does not sample
    first = step(*(seq(r, p, 0, blocks[r], sample=r != "c") for r, p in prompts.items()))
    logits = runner.execute(first)
    assert logits.shape == (3, 300)
    for row, r in enumerate(["a", "b", "d"]):
        torch.testing.assert_close(logits[row], hf_logits(hf, prompts[r])[-1], atol=ATOL, rtol=0)
    # step 2: decodes of different lengths (the decode kernel path)
    nxt = {r: 11 * i + 1 for i, r in enumerate(prompts)}
    logits = runner.execute(
        step(*(seq(r, [nxt[r]], len(p), blocks[r]) for r, p in prompts.items()))
    )
    for row, (r, p) in enumerate(prompts.items()):
        torch.testing.assert_close(logits[row], hf_logits(hf, p + [nxt[r]])[-1], atol=ATOL, rtol=0)
    # step 3: one decode mixed with one 3-token chunk (the prefill kernel path)
    more = [5, 6, 7]
    logits = runner.execute(
        step(
            seq("a", more, len(prompts["a"]) + 1, blocks["a"]),
            seq("c", [9], len(prompts["c"]) + 1, blocks["c"]),
        )
    )
    torch.testing.assert_close(
        logits[0], hf_logits(hf, prompts["a"] + [nxt["a"]] + more)[-1], atol=ATOL, rtol=0
    )
    torch.testing.assert_close(
        logits[1], hf_logits(hf, prompts["c"] + [nxt["c"], 9])[-1], atol=ATOL, rtol=0
    )


def test_shared_prefix_blocks_computed_by_another_request(checkpoint):
    path, hf = checkpoint("llama3")
    runner = make_runner(path)
    shared = prompt(8, seed=11)  # two full blocks
    a_tail, b_tail = [1, 2, 3], [4, 5, 6, 7, 8]
    runner.execute(step(seq("a", shared + a_tail, 0, [10, 20, 30])))
    # "b" reuses a's first two blocks and computes only its own tail
    logits = runner.execute(step(seq("b", b_tail, 8, [10, 20, 31, 32])))
    torch.testing.assert_close(logits[0], hf_logits(hf, shared + b_tail)[-1], atol=ATOL, rtol=0)
    # "c" is the shared prompt exactly: fully cached, it computes only its last token and
    # must not rewrite that token's cached KV (skip_kv_write)
    fully_cached = step(seq("c", shared[-1:], 7, [10, 20], skip_kv_write=1))
    logits = runner.execute(fully_cached)
    torch.testing.assert_close(logits[0], hf_logits(hf, shared)[-1], atol=ATOL, rtol=0)
    runner.kv.device_kv[:, :, 20, 3] = 5.0  # position 7 lives in block 20, row 3
    before = runner.kv.device_kv.clone()
    runner.execute(fully_cached)
    assert torch.equal(runner.kv.device_kv, before)


def test_decodes_over_shared_prefix_blocks_match_hf(checkpoint):
    path, hf = checkpoint("llama3")
    runner = make_runner(path)
    shared = prompt(8, seed=12)  # blocks 10 20, computed once by "a"
    tails = {"a": [1, 2, 3], "b": [4, 5, 6, 7, 8], "c": [9]}
    blocks = {"a": [10, 20, 30], "b": [10, 20, 31, 32], "c": [10, 20, 33]}
    runner.execute(step(seq("a", shared + tails["a"], 0, blocks["a"])))
    runner.execute(step(seq("b", tails["b"], 8, blocks["b"]), seq("c", tails["c"], 8,
                                                                   blocks["c"])))
    # One decode step: the three share blocks 10 20, read once for all (cascade on CPU).
    nxt = {"a": 40, "b": 41, "c": 42}
    decode = step(*(seq(r, [nxt[r]], 8 + len(tails[r]), blocks[r]) for r in tails))
    batch = build_forward_batch(decode.seqs, BLOCK_SIZE, torch.device("cpu"))
    plan = batch.meta.decode_plan
    assert plan is not None
    assert [(p.num_members, p.num_tokens) for p in plan.prefixes] == [(3, 8)]
    logits = runner.execute(decode)
    for row, r in enumerate(tails):
        want = hf_logits(hf, shared + tails[r] + [nxt[r]])[-1]
        torch.testing.assert_close(logits[row], want, atol=ATOL, rtol=0)


def test_swapped_blocks_come_back_through_host_memory(checkpoint):
    path, hf = checkpoint("llama")
    runner = make_runner(path, num_blocks=6, num_host_blocks=4)
    tokens = prompt(8, seed=12)
    runner.execute(step(seq("a", tokens, 0, [0, 1])))
    # a's blocks go to host slots 3 and 1; "b" then overwrites device blocks 0 and 1
    runner.execute(step(seq("b", prompt(8, seed=13), 0, [0, 1]), swap_out=[(0, 3), (1, 1)]))
    # a comes back into different device blocks and decodes one token
    logits = runner.execute(step(seq("a", [42], 8, [4, 2, 5]), swap_in=[(3, 4), (1, 2)]))
    torch.testing.assert_close(logits[0], hf_logits(hf, tokens + [42])[-1], atol=ATOL, rtol=0)


def test_step_with_only_copies_returns_no_rows(checkpoint):
    path, _ = checkpoint("llama")
    runner = make_runner(path, num_blocks=4, num_host_blocks=2)
    runner.kv.device_kv[:, :, 2] = 3.0
    logits = runner.execute(step(swap_out=[(2, 1)], swap_in=[(1, 0)]))
    assert logits.shape == (0, 300)
    assert bool((runner.kv.host_kv[:, :, 1] == 3.0).all())
    assert bool((runner.kv.device_kv[:, :, 0] == 3.0).all())


def test_bad_chunk_is_rejected(checkpoint):
    path, _ = checkpoint("llama")
    runner = make_runner(path, num_blocks=4)
    with pytest.raises(ValueError, match="2 blocks cannot hold 9 tokens"):
        runner.execute(step(seq("a", prompt(9, 1), 0, [0, 1])))
    with pytest.raises(ValueError, match=r"block id out of range \[0, 4\)"):
        runner.execute(step(seq("a", prompt(3, 1), 0, [4])))
    with pytest.raises(ValueError, match=r"swap_in \(0, 1\) is out of range"):
        runner.execute(step(swap_in=[(0, 1)]))  # the runner has no host blocks


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_close_to_fp32_hf(checkpoint, dtype):
    path, hf = checkpoint("qwen2")
    runner = make_runner(path, dtype=dtype)
    tokens, blocks = prompt(21, seed=17), shuffled_blocks(6, seed=18)
    prefill = runner.execute(step(seq("a", tokens, 0, blocks)))[0]
    decode = runner.execute(step(seq("a", [5], 21, blocks)))[0]
    for got, expected in (
        (prefill, hf_logits(hf, tokens)[-1]),
        (decode, hf_logits(hf, tokens + [5])[-1]),
    ):
        assert got.dtype == torch.float32
        assert int(got.argmax()) == int(expected.argmax())
        torch.testing.assert_close(got, expected, atol=0.01 * float(expected.abs().max()), rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,atol", [("float32", 1e-3), ("bfloat16", 0.25)])
def test_cuda_runner_with_triton_kernels_matches_hf(checkpoint, dtype, atol):
    path, hf = checkpoint("llama")
    runner = make_runner(path, num_host_blocks=2, dtype=dtype, device="cuda")
    a, b = prompt(37, seed=14), prompt(6, seed=15)
    blocks_a, blocks_b = shuffled_blocks(11, seed=16), [40, 41, 42]
    # prefill kernel: a ragged batch; then decode kernel: one token each
    logits = runner.execute(step(seq("a", a, 0, blocks_a), seq("b", b, 0, blocks_b)))
    logits = torch.cat(
        [logits, runner.execute(step(seq("a", [3], 37, blocks_a), seq("b", [4], 6, blocks_b)))]
    ).cpu()
    expected = torch.stack(
        [
            hf_logits(hf, a)[-1],
            hf_logits(hf, b)[-1],
            hf_logits(hf, a + [3])[-1],
            hf_logits(hf, b + [4])[-1],
        ]
    )
    torch.testing.assert_close(logits, expected, atol=atol, rtol=0)
