"""Request limits every OpenAI entry point applies before it does real work.

A body is refused before it is parsed when it is too large (413), nested too deeply (400:
the JSON parser recurses, and 5,000 levels crashed it into a 500), or holds more values
than any request needs (400: parsing a million token ids held the event loop 170 ms, for
every tenant of the process; counting them costs ~1-2 ms a MiB, worker/openai/json_scan.py):
more strings, lists and objects than its messages and fields need, a list longer than the
context (no prompt is; stop token ids are fewer), or more list items than a batch of prompts
that each fill it. Where the context is not known (a gateway before its first worker
report, /v1/prefixes) it is taken as `unknown_context_tokens`. Its text is refused before
it is tokenized when it is too long. Stop strings are bounded because the detokenizer scans
every one of them at every generated token.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from protocol.engine import MAX_STOP_TOKEN_IDS
from worker.openai.errors import APIError
from worker.openai.json_scan import json_shape


@dataclass(frozen=True)
class RequestLimits:
    """The limits; those an operator sets come from worker/process_settings.py."""

    max_body_bytes: int = 8 * 1024 * 1024
    max_json_depth: int = 32  # an OpenAI body needs about 5 levels
    max_prompt_chars: int = 1_000_000  # prompt or all messages' text, before tokenizing
    max_stop_chars: int = 256  # per stop string (at most 4 of them: the schema's rule)
    # engine sequences one request may start: n x the prompts of a batch (OpenAI caps n
    # at 128); each is an engine request with its own KV blocks and output
    max_sequences: int = 128
    # output tokens per sequence where the model's context is not known (a gateway in front
    # of external workers: each worker answers its own limit; this only bounds the load the
    # router charges); more than any model's context
    max_output_tokens: int = 1 << 24
    # the context a body's lists are bounded by where it is not known: Llama 3.1's 131,072
    # tokens, the longest of the models kvroute's presets name (worker/executor/sim.py)
    unknown_context_tokens: int = 1 << 17

    def __post_init__(self):
        for name in ("max_body_bytes", "max_json_depth", "max_prompt_chars",
                     "max_stop_chars", "max_sequences", "max_output_tokens",
                     "unknown_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"RequestLimits: {name} must be >= 1, got "
                                 f"{getattr(self, name)}")


def check_body_size(num_bytes: int, limits: RequestLimits) -> None:
    if num_bytes > limits.max_body_bytes:
        raise APIError(413, f"the request body is larger than {limits.max_body_bytes} bytes",
                       code="request_too_large")


MAX_MESSAGES = 4096  # per chat request; 100,000 empty ones took 2 s to template
MAX_STOP_STRINGS = 4  # OpenAI's cap; the detokenizer scans each at every token
LOGIT_BIAS_KEYS = 300  # OpenAI's cap on logit_bias entries
# Strings, lists and objects a chat message may need: one with a name and two text parts has
# 17 (13 strings, 3 objects, its content list); one more for the request's other lists.
STRINGS_PER_MESSAGE = 18
# Strings and objects of everything else one request may carry: its fields, a worker's tools
# and response_format schema (the external gateway forwards them), stop strings.
FIELD_STRINGS = 4096


def max_strings_and_objects(limits: RequestLimits) -> int:
    """The most strings, lists and objects (counted as worker/openai/json_scan.py counts
    them) any request needs: its messages, logit_bias keys, a batch's prompts (text, or
    lists of token ids) and its fields."""
    return (STRINGS_PER_MESSAGE * MAX_MESSAGES + LOGIT_BIAS_KEYS + limits.max_sequences
            + FIELD_STRINGS)


def max_one_list_items(limits: RequestLimits, max_model_len_tokens: int) -> int:
    """The most items of one list (or fields of one object) any request to a context of
    `max_model_len_tokens` needs: a prompt's token ids fit the context; stop token ids, a
    batch's prompts and a body's fields are fewer than FIELD_STRINGS."""
    return max(max_model_len_tokens, MAX_STOP_TOKEN_IDS, limits.max_sequences, FIELD_STRINGS)


def max_list_items(limits: RequestLimits, max_model_len_tokens: int) -> int:
    """The most list items and fields (commas) any request to a context of
    `max_model_len_tokens` needs: a batch of token-id prompts that each fit it, stop token
    ids, and every string and object of `max_strings_and_objects` in a list."""
    return (limits.max_sequences * max_model_len_tokens + MAX_STOP_TOKEN_IDS
            + max_strings_and_objects(limits))


def _too_deep(limits: RequestLimits) -> APIError:
    return APIError(400, f"the request body nests deeper than {limits.max_json_depth} levels",
                    code="invalid_json")


def check_json_depth(raw: bytes, limits: RequestLimits) -> None:
    """400 when `raw` nests arrays/objects deeper than the limit (checked without parsing)."""
    if raw.count(b"[") + raw.count(b"{") <= limits.max_json_depth:
        return  # no deeper than its openers (counted at C speed): the common body, at once
    if json_shape(raw).depth > limits.max_json_depth:
        raise _too_deep(limits)


def check_body_shape(raw: bytes, limits: RequestLimits,
                     max_model_len_tokens: int | None = None) -> None:
    """400 when `raw` nests deeper than the limit, or holds more strings, lists and objects,
    more items in one list, or more list items and fields in all, than any request to the
    context (`limits.unknown_context_tokens` when None) needs; counted without parsing, so a
    body no request needs never holds the event loop in the JSON parser."""
    context = (limits.unknown_context_tokens if max_model_len_tokens is None
               else max_model_len_tokens)
    words = max_strings_and_objects(limits)
    one_list = max_one_list_items(limits, context)
    items = max_list_items(limits, context)
    # each string, list or object takes 2 bytes or more, each item 1: a short body breaks
    # none of the counts
    short = len(raw) <= 2 * min(words, one_list)
    if short and raw.count(b"[") + raw.count(b"{") <= limits.max_json_depth:
        return  # the common body: no count to make
    shape = json_shape(raw)
    if shape.depth > limits.max_json_depth:
        raise _too_deep(limits)
    values = shape.strings + shape.lists + shape.objects
    if values > words:
        raise APIError(400, f"the request body holds {values} strings, lists and objects; "
                            f"no request needs more than {words} (at most {MAX_MESSAGES} "
                            f"messages, {LOGIT_BIAS_KEYS} logit_bias entries, "
                            f"{limits.max_sequences} prompts)", code="too_many_values")
    if shape.run_commas + 1 > one_list:
        raise APIError(400, f"the request body holds a list of {shape.run_commas + 1} items "
                            f"or more; no request needs more than {one_list} (a prompt's "
                            f"token ids within the {context}-token context)",
                       code="too_many_values")
    if shape.commas > items:
        raise APIError(400, f"the request body holds {shape.commas} list items and fields; "
                            f"no request needs more than {items} (at most "
                            f"{limits.max_sequences} prompts of {context} token ids, the "
                            "model's context)", code="too_many_values")


_DECODER = msgspec.json.Decoder()
# Python's parser reads what msgspec refuses only in a body this small: its parse is cheap
# there, and a large body msgspec refuses (4M ids and a NaN) would cost both parsers.
PYTHON_PARSE_MAX_BYTES = 64 * 1024


def load_object(raw: bytes, limits: RequestLimits, max_model_len_tokens: int | None = None
                ) -> dict[str, Any]:
    """The body as a JSON object, else 413/400: its size and shape checked first
    (`check_body_shape`), then parsed by msgspec (a batch of 4M token ids, what 8 MiB holds
    and a 32k context takes, in 120 ms against Python's 430). What msgspec refuses and
    Python's parser takes (NaN, Infinity, numbers past a float's range, lone surrogates) is
    read by Python's parser in a body of up to PYTHON_PARSE_MAX_BYTES, so the schema names
    the field that holds it; in a larger one it is a 400 naming the byte."""
    check_body_size(len(raw), limits)
    check_body_shape(raw, limits, max_model_len_tokens)
    try:
        data = _DECODER.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as err:
        if len(raw) > PYTHON_PARSE_MAX_BYTES:
            raise _not_json(err) from None
        try:
            data = json.loads(raw)
        # ValueError: also an integer of more than 4,300 digits (Python's conversion limit)
        except (ValueError, RecursionError) as err:
            raise _not_json(err) from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return data


def _not_json(err: Exception) -> APIError:
    return APIError(400, f"the request body is not valid JSON: {err}", code="invalid_json")


def check_text_length(num_chars: int, limits: RequestLimits, param: str) -> None:
    if num_chars > limits.max_prompt_chars:
        raise APIError(400, f"{param} has {num_chars} characters; the limit is "
                            f"{limits.max_prompt_chars}", param=param, code="prompt_too_long")


def longest_token_chars(vocab: Iterable[str]) -> int:
    """The most characters of text one token of this vocabulary can stand for: its longest
    piece (a byte-level piece has a character per byte, and a text character takes at least
    one byte; a SentencePiece piece has the text's own characters; byte-fallback and special
    pieces are longer than what they stand for)."""
    return max(1, max(map(len, vocab), default=1))


def check_text_fits(num_chars: int, max_model_len: int, max_token_chars: int,
                    param: str) -> None:
    """400 when text of `num_chars` characters cannot fit the context whatever it tokenizes
    to (no token stands for more than `max_token_chars` of them): refused before the
    tokenizer spends time on it."""
    if num_chars > max_model_len * max_token_chars:
        raise APIError(400, f"{param} has {num_chars} characters: more than the "
                            f"{max_model_len}-token context can hold", param=param,
                       code="context_length_exceeded")


def check_sequences(num_prompts: int, n: int, limits: RequestLimits) -> None:
    """400 when n, or n x the prompts of a batch, is over the sequence cap (naming n when n
    alone is, else the prompt)."""
    cap = limits.max_sequences
    if n > cap:
        raise APIError(400, f"n is {n}; at most {cap} sequences per request", param="n",
                       code="invalid_value")
    if num_prompts * n > cap:
        raise APIError(400, f"{num_prompts} prompts x n={n} is {num_prompts * n} sequences; "
                            f"at most {cap} per request", param="prompt",
                       code="invalid_value")


def check_stops(stops: tuple[str, ...], limits: RequestLimits) -> None:
    for stop in stops:
        if len(stop) > limits.max_stop_chars:
            raise APIError(400, f"a stop sequence is longer than {limits.max_stop_chars} "
                                "characters", param="stop", code="invalid_value")


async def read_body(request, limits: RequestLimits) -> bytes:
    """A Starlette request's body, refused with 413 as soon as it passes the limit (it is
    never read whole first)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        check_body_size(int(declared), limits)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        check_body_size(size, limits)
        chunks.append(chunk)
    return b"".join(chunks)
