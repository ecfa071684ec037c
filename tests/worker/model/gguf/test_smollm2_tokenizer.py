"""The tokenizer and chat template converted from smollm2's GGUF metadata equal
transformers' own reading of the same file (its GGUF tokenizer and apply_chat_template)."""

import pytest

from tests.worker.model.gguf.smollm2_oracle import CHATS, load_hf_tokenizer, long_document, prompts

TEXTS = [
    "Hello, world!",
    "What is the capital of France?",
    "  leading spaces,   runs of spaces,\ttabs\t\tand\n\n\nnewlines  \n",
    "unicode: café, naïve, Zürich, 東京都, Ελληνικά, עברית, emoji 😀👍🏽 and 🇫🇷",
    "def add(a: int, b: int) -> int:\n    return a + b  # sum\n\nprint(add(2, 40))\n",
    "numbers 3.14159, 2024-11-26, 1,000,000 and 0x1F; ids a1b2c3",
    "contractions: don't, I'm, we'll, they've, she'd, it's — and 'quoted' \"text\"",
    "<|im_start|>user\nspecial tokens inline<|im_end|>\n<|endoftext|><file_sep>",
    "not special: <|im_start |> <im_end> |im_end|",
    long_document(3),
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    return load_hf_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_equals_transformers_gguf_tokenizer(hf_tokenizer, text):
    ours = prompts().encode_text(text)
    assert ours == hf_tokenizer.encode(text)
    assert prompts().tokenizer.decode(ours, skip_special_tokens=False) == text


def test_specials_are_single_tokens_and_no_bos_is_added():
    tok = prompts().tokenizer
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [
        0, 1, 2]
    assert prompts().encode_text("<|im_end|>") == [2]  # add_bos_token is false in the file
    assert tok.get_vocab_size() == 49152


@pytest.mark.parametrize("messages", CHATS, ids=lambda m: f"{len(m)}-messages")
def test_chat_prompt_equals_apply_chat_template(hf_tokenizer, messages):
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=False)
    assert prompts().render_chat(messages) == expected
    assert prompts().encode_chat(messages) == hf_tokenizer.encode(expected)
    without = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=False,
                                               tokenize=False)
    assert prompts().render_chat(messages, add_generation_prompt=False) == without


def test_chat_without_system_gets_the_files_default_system_prompt():
    text = prompts().render_chat([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                    "by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
