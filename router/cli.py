"""`kvroute serve`: N engine replicas (each tensor-parallel) behind one OpenAI endpoint."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from router.core.policies import POLICY_NAMES

APP_NAME = "kvroute"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvroute", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "serve", help="serve a model from several cache-aware routed replicas",
        description="Start (or join) a Ray cluster and serve MODEL from --replicas engine "
                    "replicas behind an OpenAI-compatible HTTP endpoint; every request goes "
                    "to the replica that will serve it fastest given what it has cached.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="tiny",
                   help="'tiny' (embedded random-weight Llama, generated on first use) or a "
                        "Hugging Face Llama-family checkpoint directory")
    p.add_argument("--replicas", type=int, default=2, help="engine replicas (data parallel)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks per replica (one placement-group bundle each)")
    p.add_argument("--policy", default="cache_aware", choices=POLICY_NAMES,
                   help="routing policy: cache_aware weighs uncached prompt tokens against "
                        "load; the others ignore or only hash the prefix")
    p.add_argument("--block-size", type=int, default=16,
                   help="tokens per KV block (and per prefix hash)")
    p.add_argument("--engine", default="real", choices=("real", "sim"),
                   help="real: run the model; sim: simulated executor (timed like an H100 "
                        "running Llama-3-8B, no model compute) for routing experiments")
    p.add_argument("--num-blocks", type=int, default=1024,
                   help="KV blocks per replica (device pool); caps the context length too")
    p.add_argument("--host-blocks", type=int, default=0,
                   help="host-memory KV blocks per replica (0: no host tier)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length limit (default: the model's, capped by the pool)")
    p.add_argument("--api-keys", metavar="FILE", default=None,
                   help="API keys file: JSON {key: tenant} or lines 'KEY TENANT'; also read "
                        "from $KVROUTE_API_KEYS ('key=tenant,...'). Each tenant gets its own "
                        "cache namespace. Without keys the server is open")
    p.add_argument("--approximate", action="store_true",
                   help="route on the router's own routing history instead of KV events")
    p.add_argument("--load-weight", type=float, default=None,
                   help="cache_aware: prefill tokens one token of queued work costs "
                        "(default: the router's, 0.2; on CPU, where prefill queues are "
                        "long, 0.1 keeps groups on their replica)")
    p.add_argument("--imbalance-threshold", type=float, default=None,
                   help="cache_aware: tokens of queued work by which the chosen replica may "
                        "exceed the least loaded before its cache gain must pay for the "
                        "whole gap (default: the router's, inf = no guard)")
    p.add_argument("--pending-ttl-s", type=float, default=None,
                   help="a routed prompt's blocks count as cached on its replica until "
                        "the replica's events confirm them, while the request is "
                        "outstanding and this long after it finished (default: the "
                        "router's, 2 s)")
    p.add_argument("--gateways", type=int, default=1, help="gateway (HTTP ingress) processes")
    p.add_argument("--host", default="127.0.0.1", help="HTTP listen address")
    p.add_argument("--port", type=int, default=8000, help="HTTP port")
    p.add_argument("--address", default=None,
                   help="join this Ray cluster (e.g. 'auto' or 'ray://head:10001') instead of "
                        "starting a local Ray instance")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs of the local Ray instance (default: this machine's)")
    p.add_argument("--cpus-per-rank", type=float, default=None,
                   help="CPUs reserved per TP rank (default: 1, or a fair share of the "
                        "local CPUs when the replicas would not fit)")
    p.add_argument("--gpus-per-rank", type=float, default=None,
                   help="GPUs per TP rank (default: 1 with --engine real on a cluster with "
                        "GPUs, else 0)")
    p.add_argument("--sim-preset", default="h100-llama3-8b",
                   help="timing preset of the simulated executor")
    return parser


def serve_args_from(ns: argparse.Namespace, num_cpus: int | None) -> dict:
    cpus_per_rank = ns.cpus_per_rank
    if cpus_per_rank is None:
        ranks = ns.replicas * ns.tp
        cpus_per_rank = 1.0 if num_cpus is None else min(1.0, num_cpus / ranks)
    return {"model": ns.model, "replicas": ns.replicas, "tp": ns.tp, "policy": ns.policy,
            "block_size": ns.block_size, "engine": ns.engine, "num_blocks": ns.num_blocks,
            "num_host_blocks": ns.host_blocks, "api_keys_file": ns.api_keys,
            "approximate": ns.approximate, "max_model_len": ns.max_model_len,
            "gateways": ns.gateways, "cpus_per_rank": cpus_per_rank,
            "gpus_per_rank": ns.gpus_per_rank, "sim_preset": ns.sim_preset,
            "load_weight": ns.load_weight, "imbalance_threshold": ns.imbalance_threshold,
            "pending_ttl_s": ns.pending_ttl_s}


def start_ray(address: str | None, num_cpus: int | None) -> None:
    import ray

    if address:
        ray.init(address=address, namespace="serve")
    else:  # a small local footprint: no dashboard, a modest object store
        ray.init(num_cpus=num_cpus, include_dashboard=False, namespace="serve",
                 object_store_memory=256 * 1024**2)


def run_serve(ns: argparse.Namespace) -> int:
    from ray import serve

    from router.serve.app import ServeArgs, build_app

    num_cpus = None if ns.address else (ns.num_cpus or os.cpu_count() or 1)
    args = serve_args_from(ns, num_cpus)
    try:
        model = ServeArgs.from_dict(args).engine_config().served_model_name
    except ValueError as err:
        print(f"kvroute serve: {err}", file=sys.stderr)
        return 2
    start_ray(ns.address, num_cpus)
    serve.start(http_options={"host": ns.host, "port": ns.port})
    serve.run(build_app(args), name=APP_NAME, route_prefix="/")
    base = f"http://{ns.host}:{ns.port}"
    print(f"\nkvroute: serving {model!r} from {ns.replicas} replica(s) x TP {ns.tp}, "
          f"policy {ns.policy}, at {base}/v1\n"
          f"  try:    curl {base}/v1/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{model}\", \"prompt\": \"Hello\", \"max_tokens\": 16}}'\n"
          f"  health: {base}/health   ready: {base}/ready   metrics: {base}/metrics\n"
          f"  Ctrl-C stops it.", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("kvroute: shutting down (finishing accepted requests)", flush=True)
    serve.delete(APP_NAME)
    if not ns.address:
        serve.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.command == "serve":
        return run_serve(ns)
    return 2


if __name__ == "__main__":
    sys.exit(main())
