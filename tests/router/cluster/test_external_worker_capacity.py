"""An external worker's device KV capacity, read from vLLM's `vllm:cache_config_info`
(which `kvroute engine` exports too), for the pooled bound's capacity multiples."""

from prometheus_client import CollectorRegistry, generate_latest

from protocol.engine import EngineStats
from router.cluster.external_worker_probe import metrics_from_text
from router.cluster.external_worker_spec import WorkerSpec, WorkerStatus
from router.gateway.external_router import fleet_capacity_blocks
from worker.openai_server.vllm_metrics import VLLMGaugeCollector

QUEUE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
"""


def info(*series: tuple[str, str]) -> str:
    lines = ["# TYPE vllm:cache_config_info gauge"]
    for engine, (blocks, size) in enumerate(series):
        lines.append(f'vllm:cache_config_info{{block_size="{size}",cache_dtype="auto",'
                     f'engine="{engine}",num_gpu_blocks="{blocks}"}} 1.0')
    return "\n".join(lines) + "\n"


def test_capacity_is_blocks_times_block_size_summed_over_engines():
    metrics = metrics_from_text(QUEUE + info(("1000", "16"), ("500", "32")))
    assert metrics.kv_capacity_tokens == 1000 * 16 + 500 * 32
    assert metrics.stats is not None and metrics.stats.num_running == 1
    # without queue gauges the capacity is still read
    assert metrics_from_text(info(("8", "16"))) == (None, 128)


def test_a_capacity_that_is_not_counts_is_unknown():
    assert metrics_from_text(QUEUE).kv_capacity_tokens is None
    for bad in (("None", "16"), ("100", "0"), ("-5", "16"), ("1.5", "16"),
                (str(1 << 40), "16")):
        assert metrics_from_text(QUEUE + info(bad)).kv_capacity_tokens is None, bad
    # one engine's count unknown: the whole server's is
    assert metrics_from_text(QUEUE + info(("100", "16"), ("None", "16"))).kv_capacity_tokens \
        is None


def test_a_kvroute_engine_exports_its_pool_as_vllm_does():
    stats = EngineStats(0, 0, 0, num_blocks=256, num_used_blocks=0, num_cached_blocks=0,
                        num_pinned_blocks=0, num_free_blocks=256, num_host_blocks=1024,
                        num_host_cached_blocks=0)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(VLLMGaugeCollector(lambda: stats, "tiny", block_size=16))
    assert metrics_from_text(generate_latest(registry).decode()).kv_capacity_tokens == 4096
    plain = CollectorRegistry(auto_describe=True)
    plain.register(VLLMGaugeCollector(lambda: stats, "tiny"))
    assert b"cache_config_info" not in generate_latest(plain)


def status(url: str, capacity_tokens: int | None) -> WorkerStatus:
    return WorkerStatus(WorkerSpec(url), "up", kv_capacity_tokens=capacity_tokens)


def test_the_fleet_capacity_is_known_only_when_every_up_worker_says_its_own():
    a, b = status("http://a:1", 4096), status("http://b:1", 2048 + 8)
    assert fleet_capacity_blocks([a, b], 16) == 256 + 128  # floor of 6152 / 16
    assert fleet_capacity_blocks([a, status("http://c:1", None)], 16) is None
    assert fleet_capacity_blocks([], 16) is None
