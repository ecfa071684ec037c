"""dashboards/rules with the real promtool: the rules load, and unit tests fire and do not
fire every alert."""

import re
import subprocess
from pathlib import Path

import yaml

from .helm_chart import one, render
from .metrics_contract import contract_types

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "dashboards" / "rules" / "kvroute.rules.yaml"
RULE_TESTS = Path(__file__).with_name("promtool") / "kvroute_rules_test.yaml"
OPERATIONS_DOC = REPO / "docs" / "operations.md"
# The chart's prometheusRule.runbookBaseUrl default; the rule file carries it.
RUNBOOK_BASE_URL = "https://github.com/kvroute/kvroute/blob/main/docs/operations.md"


def rules_of(kind: str) -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if kind in rule]


def test_promtool_check_rules(promtool_bin):
    result = subprocess.run([promtool_bin, "check", "rules", str(RULES)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules_of('record')) + len(rules_of('alert'))} rules found" in (
        result.stdout)


def test_promtool_unit_tests_pass(promtool_bin):
    result = subprocess.run([promtool_bin, "test", "rules", RULE_TESTS.name],
                            capture_output=True, text=True, timeout=60, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_required_alerts_exist():
    assert {rule["alert"] for rule in rules_of("alert")} == {
        "KvrouteTargetAbsent", "KvrouteTargetDown", "KvrouteHigh5xxRate",
        "KvrouteLowDeliveredHitRate", "KvroutePredictionGap", "KvrouteRoutingLoss",
        "KvrouteReplicaDown",
        "KvrouteKVPressure", "KvrouteHighTTFT"}


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces
    as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_its_runbook_section_in_the_operations_guide():
    anchors = {github_anchor(line.lstrip("#")) for line in OPERATIONS_DOC.read_text().splitlines()
               if line.startswith("#")}
    for rule in rules_of("alert"):
        url = rule["annotations"]["runbook_url"]
        base, anchor = url.split("#")
        assert base == RUNBOOK_BASE_URL, rule["alert"]
        assert anchor == rule["alert"].lower()
        assert anchor in anchors, f"docs/operations.md has no section {rule['alert']}"


def test_unit_tests_fire_and_hold_every_alert_and_check_every_recording_rule():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    assert yaml.safe_load(RULE_TESTS.read_text())["rule_files"] == [
        "../../../dashboards/rules/kvroute.rules.yaml"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    held = {case["alertname"] for case in cases if not case["exp_alerts"]}
    alerts = {rule["alert"] for rule in rules_of("alert")}
    assert fired == alerts
    assert held == alerts
    # A recording rule is checked by value, or through an alert built on it that is tested.
    checked_exprs = [case["expr"] for test in tests for case in test.get("promql_expr_test", [])]
    checked_exprs += [rule["expr"] for rule in rules_of("alert")]
    checked_exprs += [rule["expr"] for rule in rules_of("record")
                      if any(rule["record"] in expr for expr in checked_exprs)]
    unchecked = [rule["record"] for rule in rules_of("record")
                 if not any(rule["record"] in expr for expr in checked_exprs)]
    assert unchecked == []


def test_rules_read_only_contract_series_and_their_own_records():
    known = set(contract_types()) | {rule["record"] for rule in rules_of("record")}
    for rule in rules_of("record") + rules_of("alert"):
        names = set(re.findall(r"[a-z_]*:?kvroute_\w+(?::\w+)?", rule["expr"]))
        assert names <= known, rule.get("record", rule.get("alert"))


def test_the_charts_thresholds_and_durations_are_the_ones_promtool_sees_fire(
        helm_bin, promtool_bin, tmp_path):
    """The PrometheusRule rendered with other thresholds and `for`, run by promtool: the 5xx
    alert now fires on the "good" model's 0.5% too, after 1 minute instead of 5."""
    values = tmp_path / "alerts.yaml"
    values.write_text(yaml.safe_dump({"prometheusRule": {
        "runbookBaseUrl": "https://ops.example.com/kvroute",
        "alerts": {"KvrouteHigh5xxRate": {"threshold": 0.001, "for": "1m"}}}}))
    rule = one(render(helm_bin, [str(values)]), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    series = [(model, endpoint, status, per_min)
              for model, endpoint, status, per_min in (
                  ("bad", "/v1/completions", "200", 540), ("bad", "/v1/completions", "503", 60),
                  ("good", "/v1/chat/completions", "200", 597),
                  ("good", "/v1/chat/completions", "500", 3))]
    description = next(r for r in rules_of("alert") if r["alert"] == "KvrouteHigh5xxRate")[
        "annotations"]["description"]

    def fired(model: str, percent: str) -> dict:
        return {"exp_labels": {"model": model, "severity": "critical"},
                "exp_annotations": {
                    "summary": f"kvroute {model}: {percent} of API requests fail with 5xx",
                    "description": description,
                    "runbook_url": "https://ops.example.com/kvroute#kvroutehigh5xxrate"}}

    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{
                "series": f'kvroute_gateway_requests_total{{model="{m}",endpoint="{e}",'
                          f'status="{s}"}}',
                "values": f"0+{n}x20"} for m, e, s, n in series],
            "alert_rule_test": [
                {"alertname": "KvrouteHigh5xxRate", "eval_time": "1m", "exp_alerts": []},
                {"alertname": "KvrouteHigh5xxRate", "eval_time": "3m",
                 "exp_alerts": [fired("bad", "10%"), fired("good", "0.5%")]}]}]}))
    result = subprocess.run([promtool_bin, "test", "rules", "test.yaml"], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    expr = next(r for group in rule["spec"]["groups"] for r in group["rules"]
                if r.get("alert") == "KvrouteHigh5xxRate")["expr"]
    assert expr == "model:kvroute_gateway_5xx_ratio:rate5m > 0.001"


def test_every_alert_has_chart_values_and_a_threshold_value_only_where_it_ends_its_expr():
    values = yaml.safe_load((REPO / "helm" / "kvroute" / "values.yaml").read_text())
    alerts = values["prometheusRule"]["alerts"]
    assert set(alerts) == {rule["alert"] for rule in rules_of("alert")}
    for rule in rules_of("alert"):
        setting = alerts[rule["alert"]]
        assert setting["for"] == rule["for"], rule["alert"]
        ends = re.search(r"[<>]=? *([0-9.eE+-]+)\s*$", rule["expr"])
        if "threshold" in setting:
            assert ends and float(ends.group(1)) == setting["threshold"], rule["alert"]
        else:
            assert rule["alert"] in ("KvrouteTargetAbsent", "KvrouteTargetDown",
                                     "KvrouteReplicaDown", "KvrouteLowDeliveredHitRate")
