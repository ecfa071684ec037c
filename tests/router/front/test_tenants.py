"""API keys -> tenants (cache salts)."""

import pytest

from router.front.tenants import TenantAuth, load_api_keys
from worker.openai.errors import APIError
from worker.process_settings import ProcessSettings

env = ProcessSettings.from_environ  # a process's settings from its variables


def test_keys_from_file_and_env(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# key tenant\nk1 team-a\n\nk2 team-b  # comment\n")
    keys = load_api_keys(str(path), env({"KVROUTE_API_KEYS": "k3=team-c,k2=team-z"}))
    assert keys == {"k1": "team-a", "k2": "team-z", "k3": "team-c"}
    (tmp_path / "keys.json").write_text('{"j1": "team-j"}')
    assert load_api_keys(str(tmp_path / "keys.json"), env({})) == {"j1": "team-j"}


def test_auth_maps_bearer_keys_and_rejects_others():
    auth = TenantAuth({"k1": "team-a"})
    assert auth.tenant_of("Bearer k1") == "team-a"
    for header in (None, "Bearer nope", "Basic k1", ""):
        with pytest.raises(APIError) as err:
            auth.tenant_of(header)
        assert err.value.status_code == 401
    assert TenantAuth({}).tenant_of(None) == ""


def test_malformed_env_entry_does_not_echo_the_secret():
    with pytest.raises(ValueError) as err:
        load_api_keys(None, env({"KVROUTE_API_KEYS": "k1=team-a,sk-very-secret"}))
    assert "sk-very-secret" not in str(err.value)
    assert "entry 2" in str(err.value)


def test_keys_are_compared_in_constant_time_against_every_key(monkeypatch):
    import router.front.tenants as tenants

    compared = []
    real = tenants.hmac.compare_digest

    def spy(a, b):
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(tenants.hmac, "compare_digest", spy)
    auth = TenantAuth({"k1": "team-a", "k2": "team-b", "k3": "team-c"})
    assert auth.tenant_of("Bearer k1") == "team-a"
    assert sorted(compared) == [b"k1", b"k2", b"k3"]  # no early exit on a match
    compared.clear()
    with pytest.raises(APIError):
        auth.tenant_of("Bearer k9")
    assert len(compared) == 3


def test_nul_in_a_namespace_field_cannot_alias_another_namespace():
    from kv.hashing import namespace_root

    assert namespace_root("m", "", "a\x00b") != namespace_root("m", "a", "b")
    assert namespace_root("m", "a\x00", "") != namespace_root("m", "a", "\x00")
    assert namespace_root("m", "a\\0", "") != namespace_root("m", "a\x00", "")
    # Fields without NUL or backslash hash as before (Protocol 1 known answers).
    assert namespace_root("tiny-llama").hex() == "988afa2c08aa7c6c0fced62001d99b55"
    assert namespace_root("tiny-llama", "", "tenant-a").hex() == (
        "aee140e2c9b6d4072f6fbf6a00b13db6")
