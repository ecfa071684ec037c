"""The chart's values for the serve settings against ServeSettings: values.schema.json is
the generated one, each chart value reaches the app as its setting, and the schema's bounds
are the settings' bounds (helm rejects what the app would reject)."""

import json

import pytest
import yaml

from router.serve.chart_values import CHART_VALUES, SCHEMA_PATH, generated, main, render
from router.serve.settings import ServeSettings
from worker.settings import SettingsError, load_settings

from .helm_chart import CHART, serve_config, template
from .helm_chart import render as render_chart

# A value other than the chart's default for every chart value.
CHANGED = {"replicas": 3, "tp": 2, "engine": "sim", "block_size": 32, "num_blocks": 77,
           "num_host_blocks": 99, "cpus_per_rank": 0.5, "policy": "least_load",
           "approximate": True, "load_weight": 0.3, "host_cost_fraction": 0.4, "gateways": 3,
           "ingress": "gateway", "pooled_sample_rate": 0.05, "pooled_window_s": 120.0,
           "workers": ["http://w0:8000", "http://w1:8000#kv_events=tcp://w1:5557"]}


def test_schema_file_is_the_generated_one():
    current = SCHEMA_PATH.read_text()
    assert SCHEMA_PATH == CHART / "values.schema.json"
    assert current == render(generated(json.loads(current))), (
        "run: python -m router.serve.chart_values")
    assert main(["--check"]) == 0


def test_check_reports_a_stale_schema(tmp_path):
    stale = json.loads(SCHEMA_PATH.read_text())
    stale["properties"]["engine"]["properties"]["replicas"]["minimum"] = 0
    path = tmp_path / "values.schema.json"
    path.write_text(render(stale))
    assert main(["--schema", str(path), "--check"]) == 1
    assert main(["--schema", str(path)]) == 0
    assert path.read_text() == SCHEMA_PATH.read_text()


def test_every_chart_value_reaches_the_app_as_its_setting(helm_bin, tmp_path):
    assert set(CHANGED) == set(CHART_VALUES)
    values: dict = {"engine": {"hostTier": {"enabled": True}}}
    for name, value in CHANGED.items():
        *parents, key = CHART_VALUES[name].path.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value
    values_file = tmp_path / "changed.yaml"
    values_file.write_text(yaml.safe_dump(values))  # a file: --set would pass 0.5 as a string
    (app,) = serve_config(render_chart(helm_bin, [str(values_file)]))["applications"]
    assert {name: app["args"][name] for name in CHANGED} == CHANGED
    assert set(app["args"]) <= set(ServeSettings.model_fields)


@pytest.mark.parametrize("name, bad", [
    ("replicas", "0"), ("engine", "fast"), ("policy", "greedy"), ("load_weight", "-1"),
    ("host_cost_fraction", "1.5"), ("cpus_per_rank", "0"), ("gateways", "0"),
    ("ingress", "proxy"), ("pooled_sample_rate", "0"), ("pooled_sample_rate", "1.5"),
    ("pooled_window_s", "0"),
])
def test_helm_rejects_what_the_settings_reject(helm_bin, name, bad):
    with pytest.raises(SettingsError, match=f"{name} = '{bad}'"):
        load_settings(ServeSettings, {name: bad}, env={})
    result = template(helm_bin, set_values=[f"{CHART_VALUES[name].path}={bad}"])
    assert result.returncode != 0
    assert "/" + CHART_VALUES[name].path.replace(".", "/") in result.stderr
