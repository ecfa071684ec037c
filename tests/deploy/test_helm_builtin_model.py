"""The chart's builtin models: `model.builtin` picks tiny or smollm2, nothing else."""

from tests.deploy.helm_chart import render, serve_config, template


def test_builtin_smollm2_is_the_model_argument(helm_bin):
    docs = render(helm_bin, set_values=["model.builtin=smollm2"])
    assert serve_config(docs)["applications"][0]["args"]["model"] == "smollm2"


def test_an_unknown_builtin_is_refused_by_the_schema(helm_bin):
    result = template(helm_bin, set_values=["model.builtin=gpt5"])
    assert result.returncode != 0
    assert "builtin" in result.stderr
