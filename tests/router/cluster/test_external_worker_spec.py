import pytest

from router.cluster.external_worker_probe import queue_stats_from_metrics
from router.cluster.external_worker_spec import (
    WorkerSpec,
    WorkerSpecError,
    canonical_url,
    parse_workers,
)


@pytest.mark.parametrize("text, url", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://Worker-A:8000/v1/", "http://worker-a:8000"),
    ("  https://w.example/serve/v1 ", "https://w.example/serve"),
    ("http://[::1]:9000", "http://[::1]:9000"),
])
def test_urls_are_canonical_server_roots(text, url):
    assert canonical_url(text) == url
    assert WorkerSpec.parse(text) == WorkerSpec(url)


def test_event_endpoints_ride_in_the_fragment_and_print_back():
    spec = WorkerSpec.parse("http://h:8000/v1#kv_events=tcp://h:5557&kv_replay=tcp://h:5558")
    assert spec == WorkerSpec("http://h:8000", "tcp://h:5557", "tcp://h:5558")
    assert spec.worker_id == "http://h:8000"
    assert WorkerSpec.parse(str(spec)) == spec
    assert str(WorkerSpec("http://h:8000")) == "http://h:8000"


@pytest.mark.parametrize("text, message", [
    ("h:8000", "must be http://host"),
    ("ftp://h", "must be http://host"),
    ("http://h:8000?x=1", "must not have a query string"),
    ("http://h:99999", "bad port"),
    ("http://h#events=tcp://h:1", "unknown key 'events'"),
    ("http://h#kv_events=http://h:1", "is not a ZMQ endpoint"),
    ("http://h#kv_events=", "needs exactly one endpoint"),
    ("http://h#kv_replay=tcp://h:1", "kv_replay without kv_events"),
])
def test_bad_workers_are_refused_naming_them(text, message):
    with pytest.raises(WorkerSpecError, match=message):
        WorkerSpec.parse(text)


def test_a_list_is_comma_separated_and_has_no_duplicates():
    assert [w.url for w in parse_workers("http://a:1, http://b:2,")] == ["http://a:1",
                                                                       "http://b:2"]
    assert parse_workers(["http://a:1"]) == (WorkerSpec("http://a:1"),)
    with pytest.raises(WorkerSpecError, match="http://a:1 is listed twice"):
        parse_workers("http://a:1,http://A:1/v1")
    with pytest.raises(WorkerSpecError, match="is not canonical"):
        WorkerSpec("http://a:1/")


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# HELP other_total x
# TYPE other_total counter
other_total 1.0
"""


def test_queue_gauges_are_summed_over_engines():
    stats = queue_stats_from_metrics(VLLM_METRICS)
    assert (stats.num_running, stats.num_waiting, stats.num_queued_prefill_tokens) == (5, 7, 0)


def test_no_queue_gauges_no_stats():
    assert queue_stats_from_metrics("other_total 1.0\n") is None
    assert queue_stats_from_metrics(VLLM_METRICS.split("# HELP vllm:num_requests_w")[0]) is None
    assert queue_stats_from_metrics("<html>not metrics</html>") is None
