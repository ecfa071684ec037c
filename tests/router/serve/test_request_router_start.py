"""What starts a request router's index mirror and samples: a prompt to route, or the
argument-less warm-up call of a process that routes (the ingress router's
`choose_replica()`, the gateway's `replica_info`), so that its first client's prompt does
not wait for the mirror's first poll; not a call that carries a request and no prompt (Serve's
proxy serving a GET through its own handle), which would make the proxy a router that
takes every replica's events and routes nothing."""

import sys

import pytest
from ray.serve._private.common import RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from router.core.process_policy import SWITCH_INTERVAL_S
from router.serve.request_router import ServeRequestRouter
from tests.router.serve.test_request_router_bookkeeping import pending, replica


def unstarted_router() -> tuple[ServeRequestRouter, list[str]]:
    router = ServeRequestRouter.__new__(ServeRequestRouter)
    router.initialize_state(model="tiny", router={"block_size": 16})
    started = []
    router.mirror.start = lambda: started.append("mirror")
    router._bound.start = lambda: started.append("bound")
    router._pusher.start = lambda: started.append("pushes")
    router.mirror.num_polls = 1  # a decision does not wait for a first poll here
    return router, started


async def test_a_warm_up_call_without_arguments_starts_the_mirror():
    router, started = unstarted_router()
    warm = PendingRequest([], {}, RequestMetadata("warm", "warm"))
    assert await router.choose_replicas([replica("a")], warm) == [[replica("a")]]
    assert sorted(started) == ["bound", "mirror", "pushes"]


async def test_a_call_with_a_request_and_no_prompt_starts_only_the_pushes():
    router, started = unstarted_router()
    get = PendingRequest([object()], {}, RequestMetadata("get", "get"))  # a proxied GET
    assert await router.choose_replicas([replica("a")], get) == [[replica("a")]]
    assert started == ["pushes"]


@pytest.mark.parametrize("calls", [1, 2])
async def test_a_prompt_starts_the_mirror_once(calls):
    router, started = unstarted_router()
    for i in range(calls):
        await router.choose_replicas([replica("a"), replica("b")], pending(f"q{i}"))
    assert sorted(started) == ["bound", "mirror", "pushes"]


def test_a_request_router_process_hands_the_gil_over_sooner():
    """Its requests and its mirror's polls run on two threads (router/core/process_policy.py)."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # CPython's default
    try:
        unstarted_router()
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(saved)
