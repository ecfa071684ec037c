"""The admin key of /v1/workers and the bodies of its answers."""

import pytest

from router.cluster.external_worker_spec import WorkerChange, WorkerSpec, WorkerStatus
from router.front.admin_key import AdminAuth, load_admin_key
from router.gateway.admin import change_body, spec_from_body
from worker.openai.errors import APIError
from worker.process_settings import ProcessSettings

env = ProcessSettings.from_environ  # a process's settings from its variables


def status_of(call) -> int:
    with pytest.raises(APIError) as info:
        call()
    return info.value.status_code


def test_the_key_comes_from_the_environment_first_then_the_file(tmp_path):
    key_file = tmp_path / "admin.key"
    key_file.write_text("from-file\n")
    assert load_admin_key(str(key_file), env({})) == "from-file"
    assert load_admin_key(str(key_file), env({"KVROUTE_ADMIN_KEY": "from-env"})) == "from-env"
    assert load_admin_key(None, env({})) is None
    (tmp_path / "empty.key").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        load_admin_key(str(tmp_path / "empty.key"), env({}))


def test_no_key_is_401_a_wrong_key_403_and_no_admin_key_configured_403():
    auth = AdminAuth("s3cret")
    auth.check("Bearer s3cret")
    assert status_of(lambda: auth.check(None)) == 401
    assert status_of(lambda: auth.check("Bearer wrong")) == 403
    assert status_of(lambda: auth.check("Basic s3cret")) == 403
    assert status_of(lambda: AdminAuth(None).check("Bearer s3cret")) == 403


def test_a_worker_body_is_a_url_and_optional_event_sockets():
    assert spec_from_body(b'{"url": "http://h:1/v1"}') == WorkerSpec("http://h:1")
    assert spec_from_body(b'{"url": "http://h:1", "kv_events": "tcp://h:2"}') == (
        WorkerSpec("http://h:1", "tcp://h:2"))
    for bad in (b"nope", b"[]", b'{"url": 3}', b'{"url": "http://h:1", "extra": 1}',
                b'{"url": "h:1"}', b'{"url": "http://h:1", "kv_events": 5}',
                b'{"url": "http://h:1#kv_events=tcp://h:2"}'):
        assert status_of(lambda bad=bad: spec_from_body(bad)) == 400, bad


def test_changes_answer_with_the_worker_or_a_status_naming_why():
    status = WorkerStatus(WorkerSpec("http://h:1"), "up")
    assert change_body(WorkerChange("added", status))["outcome"] == "added"
    assert change_body(WorkerChange("removed", status))["url"] == "http://h:1"
    assert status_of(lambda: change_body(WorkerChange("exists", status, "dup"))) == 409
    assert status_of(lambda: change_body(WorkerChange("unknown", None, "who"))) == 404
    assert status_of(lambda: change_body(WorkerChange("unusable", None, "down"))) == 502
