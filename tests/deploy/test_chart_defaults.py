"""The chart's defaults are the settings' defaults: values.yaml must write each one again (a
chart cannot import Python), so the rendered app args of the default chart are checked
against ServeSettings, the one source (the block size's 16: kv/hashing.py)."""

from router.cluster.external_worker_spec import parse_workers
from router.serve.chart_values import CHART_VALUES
from router.serve.settings import ServeSettings

from .helm_chart import render, serve_config

# Chosen for a cluster on purpose: the chart reserves a CPU for each rank in Kubernetes,
# where `kvroute serve` on one machine shares out a local Ray instance's CPUs.
CHART_OWN = {"cpus_per_rank": 1}


def test_the_default_chart_passes_the_settings_defaults(helm_bin):
    (app,) = serve_config(render(helm_bin))["applications"]
    assert set(CHART_VALUES) - set(app["args"]) == {"workers"}  # none: the arg left out
    defaults = {name: ServeSettings.model_fields[name].default for name in CHART_VALUES}
    chart = {name: app["args"].get(name, ()) for name in CHART_VALUES}
    assert parse_workers(defaults.pop("workers")) == parse_workers(chart.pop("workers")) == ()
    assert chart == {**defaults, **CHART_OWN}
