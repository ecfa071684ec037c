"""Ray Serve's own start floor on this host, with the settings `kvroute serve` starts with.

    .venv/bin/python benchmarks/serve_floor.py --port 8123

Starts a local Ray instance and Serve exactly as `kvroute serve` does (router/cli.py:
the same ray.init, Serve's HAProxy ingress and throughput-optimized variables, the same
HTTP options) and deploys a trivial app: `--replicas` replicas of one CPU each that answer
GET / with "ok", no model, no torch. bench_real_model.py times it from the process start
until HAProxy answers through a replica: what any start of a 2-replica Serve app costs here,
below which kvroute's own start cannot go. Prints the phases like `kvroute serve`; Ctrl-C
(SIGTERM) stops it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.cli import StartPhases, apply_serve_env, start_ray  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--replicas", type=int, default=2)
    args = p.parse_args()
    phases = StartPhases()
    env = apply_serve_env("direct", local=True, routers_per_node=1)
    from ray import serve

    @serve.deployment(name="Trivial", num_replicas=args.replicas,
                      ray_actor_options={"num_cpus": 1})
    class Trivial:
        async def __call__(self, request) -> str:
            return "ok"

    phases.done("imports")
    start_ray(None, os.cpu_count() or 1, env)
    phases.done("ray")
    serve.start(http_options={"host": "127.0.0.1", "port": args.port},
                controller_options={"runtime_env": {"env_vars": env}})
    phases.done("serve")
    serve.run(Trivial.bind(), name="floor", route_prefix="/")
    phases.done("app")
    print(f"\nserve_floor: {phases.summary()}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
