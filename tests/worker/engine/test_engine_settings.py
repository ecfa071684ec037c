"""`kvroute engine` and `kvroute serve` take the engine's settings from one model
(worker/engine/config.py `EngineSettings`): the same flags, help, variables and checks."""

import argparse

import pytest

from kv.hashing import DEFAULT_BLOCK_SIZE
from router.cli import _parser, main
from worker.engine.config import EngineSettings
from worker.openai_server.main import add_engine_arguments, configs_from
from worker.settings import SettingsError


def _flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_the_engine_flags_of_serve_and_engine_are_one_model():
    engine, serve = _flags(_subparser("engine")), _flags(_subparser("serve"))
    for name in EngineSettings.model_fields:
        flag = "--" + name.replace("_", "-")
        assert flag in engine and flag in serve, flag
        if name != "model":  # serve's own default: the real model
            assert engine[flag] == serve[flag], flag
    assert "env $" not in engine["--port"]
    assert "default: tiny" in engine["--model"] and "default: smollm2" in serve["--model"]


def _configs(argv, environ):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return configs_from(parser.parse_args(argv), environ)


def test_flags_win_over_variables_which_win_over_defaults():
    # KVROUTE_PORT as Kubernetes sets it for a Service named kvroute: the listener's
    # settings come from flags only
    engine, server = _configs(["--block-size", "32", "--replica-id", "r1"],
                              {"KVROUTE_BLOCK_SIZE": "8", "KVROUTE_NUM_BLOCKS": "128",
                               "KVROUTE_PORT": "tcp://10.96.0.12:8000"})
    assert (engine.block_size, engine.num_blocks, engine.replica_id) == (32, 128, "r1")
    assert engine.max_num_seqs == EngineSettings().max_num_seqs and server.port == 8000
    default, _ = _configs([], {})
    assert default.block_size == DEFAULT_BLOCK_SIZE and default.tp_launcher == "local"


@pytest.mark.parametrize("argv, message", [
    (["--tp", "0"], "tp = '0' (from --tp)"),
    (["--engine", "gpu"], "engine = 'gpu' (from --engine)"),
    (["--port", "70000"], "port = '70000' (from --port)"),
])
def test_a_bad_setting_names_its_flag(argv, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _configs(argv, {})


def test_kvroute_engine_answers_a_bad_setting_with_status_2(capsys):
    assert main(["engine", "--num-blocks", "-1"]) == 2
    assert "num_blocks = '-1' (from --num-blocks)" in capsys.readouterr().err
