"""What a Serve engine replica pushes to the metrics hub: its kvroute_engine_* series and
vLLM's gauge names, labelled with the replica so two replicas' series never merge."""

from prometheus_client import generate_latest

from protocol.engine import EngineRequest, SamplingParams
from router.cluster.metrics_hub import exposition, merge_families
from router.serve.engine_replica import pushed_registry
from worker.engine.config import EngineConfig
from worker.engine.factory import build_engine

VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def make_engine(replica_id: str):
    return build_engine(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                     num_blocks=64, block_size=16, replica_id=replica_id))


async def test_the_pushed_registry_holds_the_engine_series_and_the_vllm_gauges():
    engine = make_engine("r1")
    registry = pushed_registry(engine, "r1")
    labels = {"model_name": "tiny", "engine": "0", "replica": "r1"}
    for name in VLLM_GAUGES:
        assert registry.get_sample_value(name, labels) == 0.0, name
    assert registry.get_sample_value("kvroute_engine_prompt_tokens_total",
                                     {"model": "tiny", "replica": "r1"}) == 0.0
    # a request holding blocks: read at the next collect, never stale
    deltas = engine.generate(EngineRequest("a", list(range(3, 43)),
                                           SamplingParams(max_tokens=8, ignore_eos=True)))
    await anext(deltas)
    stats = engine.stats()
    assert registry.get_sample_value("vllm:num_requests_running", labels) == 1.0
    assert registry.get_sample_value("vllm:kv_cache_usage_perc", labels) == (
        (stats.num_used_blocks + stats.num_pinned_blocks) / stats.num_blocks)
    await deltas.aclose()
    await engine.shutdown()


async def test_two_replicas_gauges_stay_apart_in_the_hub():
    replica_ids = ("r1", "r2")
    engines = [make_engine(r) for r in replica_ids]
    merged = merge_families([list(pushed_registry(e, r).collect())
                             for e, r in zip(engines, replica_ids, strict=True)])
    text = exposition(merged).decode()
    for replica in ("r1", "r2"):
        assert (f'vllm:num_requests_waiting{{engine="0",model_name="tiny",replica="{replica}"}}'
                ' 0.0') in text
    assert generate_latest(pushed_registry(engines[0], "r1")).count(b"# TYPE vllm:") == 4
    for engine in engines:
        await engine.shutdown()
