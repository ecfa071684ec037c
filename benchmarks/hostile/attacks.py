"""The hostile tenant's worst single requests, by family, as raw bytes (a JSON encoder would
refuse NaN or round 10**309), each sent alone and its answer's status kept.

Families: numeric extremes in every numeric field; huge and out-of-range lists; unbounded
text before tokenizing; unknown paths; requests abandoned at every stage. The lying worker,
the event stream and the quota race are in liar.py and quota.py.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from benchmarks.hostile.client import SSL_CONTEXT
from benchmarks.hostile.fronts import Front

NUMBERS = ("1e308", "1e9", "1" + "0" * 309, "-1", "NaN", "Infinity", "-Infinity",
           str(2**64), str(2**63), "-1e308", "1e-320", "0", "1.5", "-0.0")
SAMPLING_FIELDS = ("max_tokens", "n", "temperature", "top_p", "top_k", "seed", "min_tokens",
                   "presence_penalty", "frequency_penalty", "best_of")
COMPLETION_ONLY = ("logprobs",)
CHAT_ONLY = ("max_completion_tokens", "top_logprobs")
EIGHT_MB = 8 * 1024 * 1024 - 4096  # just under the body cap: the text itself is the attack


@dataclass(frozen=True)
class Attack:
    family: str
    name: str
    send: Callable[[Front], str]  # the outcome: an HTTP status, or what happened


def _post(path: str, raw: bytes, timeout_s: float = 120.0) -> Callable[[Front], str]:
    def send(front: Front) -> str:
        headers = {**front.hostile_headers, "Content-Type": "application/json"}
        try:
            return str(httpx.post(f"{front.base_url}{path}", content=raw, headers=headers,
                                  timeout=timeout_s, verify=SSL_CONTEXT).status_code)
        except httpx.HTTPError as err:
            return type(err).__name__
    return send


def _completion(extra: str, prompt: str = '"hostile"') -> bytes:
    return f'{{"model": "tiny", "prompt": {prompt}, {extra}}}'.encode()


def _chat(extra: str, content: str = '"hostile"') -> bytes:
    return (f'{{"model": "tiny", "messages": [{{"role": "user", "content": {content}}}], '
            f'{extra}}}').encode()


def numeric_extremes() -> Iterator[Attack]:
    for value in NUMBERS:
        for field in SAMPLING_FIELDS + COMPLETION_ONLY:
            extra = f'"{field}": {value}' + ("" if field == "max_tokens" else
                                             ', "max_tokens": 4')
            yield Attack("numeric", f"completion {field}={value[:12]}",
                         _post("/v1/completions", _completion(extra)))
        for field in SAMPLING_FIELDS + CHAT_ONLY:
            extra = f'"{field}": {value}' + ("" if "max" in field else ', "max_tokens": 4')
            if field == "top_logprobs":
                extra += ', "logprobs": true'
            yield Attack("numeric", f"chat {field}={value[:12]}",
                         _post("/v1/chat/completions", _chat(extra)))


def huge_lists() -> Iterator[Attack]:
    many_ids = json.dumps(list(range(1_000_000)))  # ~7 MB of ids
    cases = {
        "stop_token_ids out of vocab with min_tokens":
            _completion('"stop_token_ids": [1000000], "min_tokens": 4, "max_tokens": 8'),
        "stop_token_ids negative": _completion('"stop_token_ids": [-1], "max_tokens": 4'),
        "stop_token_ids 2**64": _completion(f'"stop_token_ids": [{2**64}], "max_tokens": 4'),
        "stop_token_ids 1M ids, n=128, seed": _completion(
            f'"stop_token_ids": {many_ids}, "n": 128, "seed": 7, "max_tokens": 4'),
        "logit_bias 200k entries": _completion('"logit_bias": {' + ", ".join(
            f'"{i}": 100' for i in range(200_000)) + '}, "max_tokens": 4'),
        "stop 100k strings": _completion('"stop": ' + json.dumps(
            [f"s{i}" for i in range(100_000)]) + ', "max_tokens": 4'),
        "prompt ids out of vocab": _completion('"max_tokens": 4', "[1000000, 5, 6]"),
        "prompt ids > 2**64": _completion('"max_tokens": 4', f"[{2**64 + 5}, 5]"),
        "prompt ids negative": _completion('"max_tokens": 4', "[-5, 5]"),
        "prompt 1M ids": _completion('"max_tokens": 4', many_ids),
        "prompt 100k strings": _completion('"max_tokens": 1', json.dumps(["x"] * 100_000)),
        "n huge over a batch": _completion('"n": 100000, "max_tokens": 1',
                                           json.dumps(["a", "b", "c"])),
        "100k chat messages": ('{"model": "tiny", "max_tokens": 1, "messages": ' + json.dumps(
            [{"role": "user", "content": "x"}] * 100_000) + "}").encode(),
    }
    for name, raw in cases.items():
        yield Attack("lists", name, _post("/v1/completions" if b'"messages"' not in raw
                                          else "/v1/chat/completions", raw))


def unbounded_text() -> Iterator[Attack]:
    text = json.dumps("z" * EIGHT_MB)
    yield Attack("text", "8 MB prompt", _post("/v1/completions",
                                              _completion('"max_tokens": 1', text)))
    yield Attack("text", "8 MB chat message", _post("/v1/chat/completions",
                                                    _chat('"max_tokens": 1', text)))
    yield Attack("text", "8 MB stop string", _post("/v1/completions", _completion(
        f'"stop": {text}, "max_tokens": 1')))
    yield Attack("text", "8 MB tokenize", _post("/tokenize", (
        f'{{"model": "tiny", "prompt": {text}}}').encode()))


def unknown_paths() -> Iterator[Attack]:
    body = _completion('"max_tokens": 1000', json.dumps("unrouted " * 40))
    for path in ("/v1/nope", "/v1/prefixes", "/v1/completions/x", "/internal/route",
                 "/v1/workers", "/metrics", "//v1/completions"):
        yield Attack("paths", f"POST {path}", _post(path, body))


def _socket(front: Front) -> socket.socket:
    url = urlsplit(front.base_url)
    return socket.create_connection((url.hostname, url.port), timeout=30)


def _request_head(front: Front, path: str, length: int) -> bytes:
    headers = "".join(f"{k}: {v}\r\n" for k, v in front.hostile_headers.items())
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Connection: close\r\n"
            f"Content-Length: {length}\r\n{headers}\r\n").encode()


def _abandon(stage: str) -> Callable[[Front], str]:
    """Opens a request and walks away at `stage`."""
    def send(front: Front) -> str:
        stream = stage in ("before first token", "mid-stream")
        body = _completion(f'"max_tokens": 2000, "ignore_eos": true, "stream": '
                           f'{"true" if stream else "false"}', json.dumps("leave " * 300))
        try:
            with _socket(front) as s:
                if stage == "connect":
                    return "closed"
                if stage == "half a body":
                    s.sendall(_request_head(front, "/v1/completions", len(body))
                              + body[:len(body) // 2])
                    return "closed"
                s.sendall(_request_head(front, "/v1/completions", len(body)) + body)
                if stage == "mid-stream":
                    got = s.recv(65536)
                    if not got.startswith(b"HTTP/1.1 200"):  # refused: nothing to leave
                        return got.split(b" ", 2)[1].decode() if got else "closed"
                    while got.count(b"data: ") < 3:
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        got += chunk
                elif stage == "waiting for a whole answer":
                    time.sleep(0.3)  # the request is running when the client goes
                return "closed"
        except OSError as err:
            return type(err).__name__
    return send


def abandoned() -> Iterator[Attack]:
    for stage in ("connect", "half a body", "before first token", "mid-stream",
                  "waiting for a whole answer"):
        for i in range(6):
            yield Attack("abandoned", f"{stage} #{i}", _abandon(stage))


def all_attacks() -> list[Attack]:
    return [*numeric_extremes(), *huge_lists(), *unbounded_text(), *unknown_paths(),
            *abandoned()]


QUICK = ("completion max_tokens=1e308", "completion max_tokens=1e9",
         "completion max_tokens=100000000000", "completion n=1e9", "chat temperature=NaN",
         "completion seed=184467440737", "stop_token_ids out of vocab with min_tokens",
         "stop_token_ids 1M ids, n=128, seed", "prompt ids > 2**64", "logit_bias 200k entries",
         "8 MB prompt", "POST /v1/nope", "POST /v1/prefixes", "connect #0", "half a body #0",
         "before first token #0", "mid-stream #0", "waiting for a whole answer #0")


def quick_attacks() -> list[Attack]:
    """One or a few of each family, for the test suite."""
    return [a for a in all_attacks() if a.name in QUICK]
