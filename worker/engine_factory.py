"""Builds an Engine from an EngineConfig: resolves the model, tokenizer and executor."""

from __future__ import annotations

from tokenizers import Tokenizer

from worker.engine import Engine
from worker.engine_config import EngineConfig
from worker.loader import load_model_config
from worker.sim import SimExecutor
from worker.tiny import resolve_model
from worker.tokenizer_files import load_tokenizer_files


def build_engine(config: EngineConfig) -> Engine:
    model_dir = resolve_model(config.model)
    model_config = load_model_config(model_dir)
    tokenizer = Tokenizer.from_file(str(load_tokenizer_files(model_dir).tokenizer_path))
    max_model_len = config.max_model_len or model_config.max_model_len_tokens
    if config.engine == "sim":
        executor = SimExecutor(config.sim_preset, vocab_size=model_config.vocab_size,
                               eos_token_ids=model_config.eos_token_ids, realtime=True)
    else:
        from worker.model_step_executor import ModelStepExecutor

        executor = ModelStepExecutor(model_dir, config)
    return Engine(config, executor, tokenizer, max_model_len)
