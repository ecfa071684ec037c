"""API keys -> tenants (cache salts)."""

import pytest

from router.gateway.tenants import TenantAuth, load_api_keys
from worker.openai.errors import APIError


def test_keys_from_file_and_env(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# key tenant\nk1 team-a\n\nk2 team-b  # comment\n")
    keys = load_api_keys(str(path), {"KVROUTE_API_KEYS": "k3=team-c,k2=team-z"})
    assert keys == {"k1": "team-a", "k2": "team-z", "k3": "team-c"}
    (tmp_path / "keys.json").write_text('{"j1": "team-j"}')
    assert load_api_keys(str(tmp_path / "keys.json"), {}) == {"j1": "team-j"}


def test_auth_maps_bearer_keys_and_rejects_others():
    auth = TenantAuth({"k1": "team-a"})
    assert auth.tenant_of("Bearer k1") == "team-a"
    for header in (None, "Bearer nope", "Basic k1", ""):
        with pytest.raises(APIError) as err:
            auth.tenant_of(header)
        assert err.value.status_code == 401
    assert TenantAuth({}).tenant_of(None) == ""
