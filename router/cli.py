"""`kvroute serve`: N engine replicas (each tensor-parallel), or external OpenAI-compatible
workers (--workers), behind one OpenAI endpoint."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from router.serve.settings import LaunchSettings, ServeSettings
from worker.openai_server.main import add_engine_arguments, run_engine
from worker.process_settings import ProcessSettings
from worker.settings import SettingsError, add_flags, flag_name, given_flags, load_settings

APP_NAME = "kvroute"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvroute", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "serve", help="serve a model from several cache-aware routed replicas",
        description="Start (or join) a Ray cluster and serve MODEL from --replicas engine "
                    "replicas behind an OpenAI-compatible HTTP endpoint; every request goes "
                    "to the replica that will serve it fastest given what it has cached. "
                    "Every flag but --port can also be set by its KVROUTE_<NAME> environment "
                    "variable (named in its help); a flag given wins over the variable.")
    add_flags(p, ServeSettings)
    add_flags(p, LaunchSettings)
    e = sub.add_parser(
        "engine", help="serve one engine replica as a standalone OpenAI server",
        description="Serve MODEL from one engine replica in this process (no Ray) as an "
                    "OpenAI-compatible HTTP server, as `vllm serve` does: a worker for "
                    "`kvroute serve --workers` or any other router. The engine's flags can also be "
                    "set by their KVROUTE_<NAME> variables (named in their help); a flag "
                    "given wins.")
    add_engine_arguments(e)
    return parser


def local_cpus_per_rank(settings: ServeSettings, num_cpus: int | None) -> ServeSettings:
    """Unless set, each TP rank reserves 1 CPU, or a fair share of a local Ray instance's
    CPUs when the replicas would not fit otherwise."""
    if settings.cpus_per_rank is not None:
        return settings
    ranks = settings.replicas * settings.tp
    share = 1.0 if num_cpus is None else min(1.0, num_cpus / ranks)
    return settings.model_copy(update={"cpus_per_rank": share})


def start_ray(address: str | None, num_cpus: int | None, env: dict[str, str]) -> None:
    import ray

    if address:  # the Serve processes of a joined cluster take the job's env
        ray.init(address=address, namespace="serve", runtime_env={"env_vars": env})
    else:  # a small local footprint: no dashboard, a modest object store
        # address="local": a new instance, never a cluster some `ray start` left running
        # on this machine (ray.init alone would join it).
        # No idle workers started ahead (Ray starts one per CPU): in a start they sat idle
        # while every actor started a worker of its own (the Serve actors carry a
        # runtime_env they lack), each a Python start taken from a small host's replicas.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, namespace="serve",
                 object_store_memory=256 * 1024**2,
                 _system_config={"prestart_worker_first_driver": False})


class StartPhases:
    """How long each phase of a start took, in the order they ran, for one line once up."""

    def __init__(self) -> None:
        self._start_s = self._last_s = time.monotonic()
        self.spans_s: list[tuple[str, float]] = []

    def done(self, name: str) -> None:
        now_s = time.monotonic()
        self.spans_s.append((name, now_s - self._last_s))
        self._last_s = now_s

    def summary(self) -> str:
        spans = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.spans_s)
        return f"up in {self._last_s - self._start_s:.1f} s ({spans})"


def start_cluster_actors() -> None:
    """Creates the KV index and metrics hub actors now, without waiting for them: else the
    first engine replica creates them once its model is loaded, and the start waits for
    their processes after the slowest part instead of beside it."""
    from router.cluster.index_actor import get_index_actor
    from router.cluster.metrics_hub import get_metrics_hub

    get_index_actor()
    get_metrics_hub()


def apply_serve_env(ingress: str, local: bool, routers_per_node: int) -> dict[str, str]:
    """Ray Serve's settings for this ingress (router/serve/serve_env.py) in this process's
    environment, before anything imports Ray Serve. Returns every RAY_SERVE_ variable, for
    the processes of a joined cluster."""
    from router.serve.serve_env import serve_env

    os.environ.update(serve_env(ingress, local, os.environ, routers_per_node))
    return {name: value for name, value in os.environ.items() if name.startswith("RAY_SERVE_")}


def run_serve(ns: argparse.Namespace) -> int:
    phases = StartPhases()
    try:
        settings = load_settings(ServeSettings, given_flags(ns, ServeSettings), os.environ,
                                 flag_name)
        launch = load_settings(LaunchSettings, given_flags(ns, LaunchSettings), os.environ,
                               flag_name)
        ProcessSettings.from_environ(os.environ)  # the replicas' own: bad ones fail here
    except SettingsError as err:
        print(f"kvroute serve: {err}", file=sys.stderr)
        return 2
    env = apply_serve_env(settings.ingress, local=not launch.address,
                          routers_per_node=settings.gateways)
    from ray import serve

    from router.apps.build import serve_application

    phases.done("imports")
    num_cpus = None if launch.address else (launch.num_cpus or os.cpu_count() or 1)
    settings = local_cpus_per_rank(settings, num_cpus)
    if settings.workers:
        if not _workers_usable(settings):
            return 2
        model, source = settings.model, f"{len(settings.workers)} external worker(s)"
    else:
        if not _model_usable(settings, local=not launch.address):
            return 2
        model = settings.engine_config().served_model_name
        source = f"{settings.replicas} replica(s) x TP {settings.tp}"
    phases.done("model found")
    start_ray(launch.address, num_cpus, env)
    phases.done("ray")
    # A joined cluster's Serve controller takes the env from here (its proxies and our
    # replicas inherit the controller's and the job's); on a local instance it is there.
    controller = {"runtime_env": {"env_vars": env}}
    if settings.workers:  # its gateways serve HTTP themselves (router/apps/external.py)
        from router.apps.external import workers_application
        from router.front.http_server import HttpConfig

        serve.start(proxy_location="Disabled", controller_options=controller)
        phases.done("serve")
        serve.run(workers_application(settings, HttpConfig(launch.host, launch.port)),
                  name=APP_NAME, route_prefix=None)
    else:
        start_cluster_actors()  # their processes start while Serve and the replicas do
        serve.start(http_options={"host": launch.host, "port": launch.port},
                    controller_options=controller)
        phases.done("serve")
        serve.run(serve_application(settings), name=APP_NAME, route_prefix="/")
    phases.done("app")
    base = f"http://{launch.host}:{launch.port}"
    print(f"\nkvroute: {phases.summary()}", flush=True)
    print(f"kvroute: serving {model!r} from {source}, policy {settings.policy}, at "
          f"{base}/v1\n"
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
    if not launch.address:
        serve.shutdown()
    return 0


def _model_usable(settings: ServeSettings, local: bool) -> bool:
    """Finds the model before anything starts, converting a GGUF file (or the built-in
    smollm2) here once rather than in every replica; prints what is wrong."""
    from worker.tokenizer.files import TINY_NAME, checkpoint_dir

    if settings.model == TINY_NAME:
        return True
    try:  # the weights only when the replicas run here and run the model
        checkpoint_dir(settings.model, weights=local and settings.engine == "real")
    except (OSError, ValueError) as err:
        print(f"kvroute serve: {err}", file=sys.stderr)
        return False
    return True


def _workers_usable(settings: ServeSettings) -> bool:
    """Checks the tokenizer and every worker before anything starts; prints what is wrong."""
    from router.apps.external import check_workers, external_gateway_config
    from router.cluster.external_worker_spec import parse_workers
    from worker.tokenizer.files import load_tokenizer_files, tokenizer_dir

    config = external_gateway_config(settings)
    try:
        load_tokenizer_files(tokenizer_dir(config.tokenizer))
    except FileNotFoundError as err:
        print(f"kvroute serve: the gateway tokenizes prompts to route them and needs the "
              f"workers' tokenizer: {err}; set --tokenizer DIR", file=sys.stderr)
        return False
    problems = check_workers(parse_workers(settings.workers), settings.model)
    for problem in problems:
        print(f"kvroute serve: {problem}", file=sys.stderr)
    return not problems


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.command == "serve":
        return run_serve(ns)
    if ns.command == "engine":
        return run_engine(ns)
    return 2


if __name__ == "__main__":
    sys.exit(main())
