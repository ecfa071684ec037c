"""The loss ladder behind external workers, in a gateway's ExternalWorkerRouter (no Ray):
each routed prompt is sampled once for the pooled bound, the fleet's capacity comes from
the workers' own KV capacity, and each release counts the miss causes (all four from the
answer's cached tokens of the prompt routed, the decision's three otherwise)."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kv.events import EventLog
from router.cluster.external_worker_spec import WorkerSetView, WorkerSpec, WorkerStatus
from router.core.router import RouterConfig
from router.gateway.external_router import ExternalWorkerRouter
from router.gateway.output_tokens import AnswerUsage
from tests.router.core.test_core import prompt

B = 16
A, C = WorkerSpec("http://a:8000"), WorkerSpec("http://c:8000")


def make_router(capacity_tokens: tuple[int | None, int | None]) -> ExternalWorkerRouter:
    router = ExternalWorkerRouter(RouterConfig(block_size=B, policy="round_robin"), "tiny",
                                  "gw-test", worker_set=None)
    router._apply(WorkerSetView(1, tuple(
        WorkerStatus(spec, "up", kv_capacity_tokens=tokens)
        for spec, tokens in zip((A, C), capacity_tokens))))  # what the poll loop does
    return router


def misses(router: ExternalWorkerRouter) -> dict[str, float]:
    text = generate_latest(router.metrics.registry).decode()
    return {s.labels["cause"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "kvroute_miss_tokens_total" and s.value}


async def test_prompts_are_sampled_once_and_the_capacity_is_the_workers_own():
    router = make_router((4096, 2048))
    assert router.bound.capacity_blocks == (4096 + 2048) // B
    router.route("q~0", prompt(0, 1), 40, 8)
    router.release("q~0", "it failed before any reply")  # drained here, tried elsewhere
    router.route("q~1", prompt(0, 1), 40, 8, exclude=frozenset({A.worker_id}))
    batch = router.bound.sampler.take(router.bound.capacity_blocks)
    assert (batch.num_blocks, batch.num_prompt_tokens, batch.capacity_blocks) == (2, 40, 384)
    assert make_router((4096, None)).bound.capacity_blocks is None  # one worker unknown


async def test_each_release_counts_the_miss_causes():
    router = make_router((4096, 4096))
    log = EventLog(A.worker_id, epoch="e0")
    assert router.router.apply_batch(log.drain())
    router.router.apply_snapshot(log.snapshot(prompt(0, 1, 2), ()))
    # no index actor here: every worker starts on routed history; A is routed on its
    # events (which the snapshot stands for), as when the index actor follows them
    router._refresh_modes()
    router.router.set_replica_approximate(A.worker_id, False)
    # round robin: the first to A (48 predicted), its answer says 32 cached of its 70
    worker, _ = router.route("q1", prompt(0, 1, 2, 3), 70, 8)
    assert worker == A
    router.release("q1", None, output_tokens=8, usage=AnswerUsage(8, 70, 32))
    assert misses(router) == {"race": 16, "cold": 22}
    # to C: no usage in its answer (a stream without include_usage): the decision's causes
    worker, _ = router.route("q2", prompt(0, 1, 2, 3), 70, 8)
    assert worker == C
    router.release("q2", None, output_tokens=8)
    assert misses(router) == {"race": 16, "cold": 22 + 6, "placement": 64}
    # cached tokens of another prompt count (a batch's total): the decision's causes
    router.route("q3", prompt(9), 20, 8)
    router.release("q3", None, usage=AnswerUsage(8, 40, 16))
    assert misses(router) == {"race": 16, "cold": 22 + 6 + 20, "placement": 64}
    # failed mid-answer, or refused: nothing counted
    router.route("q4", prompt(8), 20, 8)
    router.release("q4", "cut", output_tokens=3)
    router.route("q5", prompt(7), 20, 8)
    router.release("q5", None, refused=True)
    assert misses(router) == {"race": 16, "cold": 48, "placement": 64}
