"""Builds an Engine from an EngineConfig: resolves the model, tokenizer and executor."""

from __future__ import annotations

from tokenizers import Tokenizer

from worker.engine.config import EngineConfig
from worker.engine.engine import Engine
from worker.executor.sim import SimExecutor
from worker.model.loader import load_model_config
from worker.model.tiny import resolve_model
from worker.tokenizer.files import load_tokenizer_files


def build_engine(config: EngineConfig) -> Engine:
    model_dir = resolve_model(config.model)
    model_config = load_model_config(model_dir)
    tokenizer = Tokenizer.from_file(str(load_tokenizer_files(model_dir).tokenizer_path))
    max_model_len = config.max_model_len or model_config.max_model_len_tokens
    if config.engine == "sim":
        executor = SimExecutor(config.sim_preset, vocab_size=model_config.vocab_size,
                               eos_token_ids=model_config.eos_token_ids, realtime=True)
    else:
        from worker.executor.model_step_executor import ModelStepExecutor

        executor = ModelStepExecutor(model_dir, config)
    return Engine(config, executor, tokenizer, max_model_len)
