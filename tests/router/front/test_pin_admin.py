"""Pins as an admin operation with a per-tenant quota. The reproducer: one
prefix pinned under 10,000 names was accepted against a 4-block budget."""

import json

import pytest

from protocol.engine import PinResult
from router.cluster.prefix_registry import PrefixRegistry
from router.front.pin_admin import PinAdmin, PinQuota
from router.front.prefixes import PrefixService
from router.front.tenants import TenantAuth
from worker.openai.errors import APIError
from worker.openai.prompt import PromptBuilder
from worker.tokenizer.files import tokenizer_dir


class Remote:
    """An actor method stand-in: `.remote(...)` is awaitable, like a Ray ObjectRef."""

    def __init__(self, fn):
        self._fn = fn

    async def remote(self, *args):
        return self._fn(*args)


class FakeIndex:
    def __init__(self):
        self.registry = PrefixRegistry()
        self.put_prefix = Remote(self.registry.put)
        self.list_prefixes = Remote(self.registry.of_tenant)
        self.reserve_prefix = Remote(self.registry.reserve)
        self.release_prefix = Remote(self.registry.release)


class FakeEngine:
    def __init__(self):
        self.calls = []

    async def call(self, method, message):
        self.calls.append((method, message))
        blocks = len(message.prompt_token_ids) // 16 if method == "pin_prefix" else 0
        return PinResult("r0", blocks)


def make_service(quota: PinQuota):
    engine, index = FakeEngine(), FakeIndex()
    prompts = PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)
    return PrefixService(engine, index, prompts, quota), engine, index


async def test_same_prefix_under_many_names_is_charged_each_time():
    service, engine, _ = make_service(PinQuota(max_names_per_tenant=100,
                                               max_blocks_per_tenant=4))
    body = {"name": "n0", "prompt": list(range(3, 67))}  # 4 blocks

    async def register(name):
        return await service.register(json.dumps({**body, "name": name}).encode(), "t",
                                      lambda model: None)

    assert (await register("n0"))["num_pinned_blocks"] == 4
    assert (await register("n0"))["num_pinned_blocks"] == 4  # a re-pin replaces itself
    with pytest.raises(APIError) as err:
        await register("n1")  # the same 4 blocks again: charged, over the quota
    assert err.value.status_code == 429 and err.value.code == "pin_quota_exceeded"
    assert len([c for c in engine.calls if c[0] == "pin_prefix"]) == 2  # no engine work
    other, _, _ = make_service(PinQuota(max_names_per_tenant=2, max_blocks_per_tenant=100))
    for name in ("a", "b"):
        await other.register(json.dumps({**body, "name": name}).encode(), "t", lambda m: None)
    with pytest.raises(APIError, match="quota 2 names"):
        await other.register(json.dumps({**body, "name": "c"}).encode(), "t", lambda m: None)
    # Another tenant has its own quota.
    await other.register(json.dumps({**body, "name": "c"}).encode(), "u", lambda m: None)


def test_pins_need_the_admin_key_once_keys_are_configured():
    tenants = TenantAuth({"tenant-key": "team-a"})
    admin = PinAdmin(tenants, "admin-secret", PinQuota())
    for headers, status in (({"authorization": "Bearer tenant-key"}, 403),
                            ({}, 401), ({"authorization": "Bearer wrong"}, 403)):
        with pytest.raises(APIError) as err:
            admin.tenant_for_change(headers)
        assert err.value.status_code == status
    assert admin.tenant_for_change({"authorization": "Bearer admin-secret",
                                    "x-kvroute-tenant": "team-a"}) == "team-a"
    # Keys without an admin key: nobody may pin.
    with pytest.raises(APIError) as err:
        PinAdmin(tenants, None, PinQuota()).tenant_for_change(
            {"authorization": "Bearer tenant-key"})
    assert err.value.status_code == 403
    # No keys at all (single user): open, as the anonymous tenant.
    assert PinAdmin(TenantAuth({}), None, PinQuota()).tenant_for_change({}) == ""
