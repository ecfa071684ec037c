"""RequestOutput: a request's output merged between the step loop and its consumer."""

import asyncio

import pytest

from protocol.engine import Usage
from worker.engine.request_output import RequestOutput


def test_steps_not_taken_yet_come_out_as_one_delta():
    out = RequestOutput("r1")
    assert out.take_nowait() is None
    out.put(5, "a")
    out.put(6, "")  # a token whose text is not complete yet
    out.put(7, "bc")
    delta = out.take_nowait()
    assert (delta.request_id, delta.token_ids, delta.text) == ("r1", [5, 6, 7], "abc")
    assert delta.finish_reason is None and delta.usage is None
    assert out.take_nowait() is None  # taken: nothing left


def test_the_last_delta_carries_finish_reason_usage_and_error():
    out = RequestOutput("r2")
    out.put(1, "x")
    assert out.take_nowait().token_ids == [1]
    usage = Usage(3, 2, 0, 0)
    out.put(2, "y", "length", usage)
    assert out.finished
    delta = out.take_nowait()
    assert (delta.token_ids, delta.text, delta.finish_reason, delta.usage) == (
        [2], "y", "length", usage)
    with pytest.raises(RuntimeError, match="already finished"):
        out.put(3, "z")
    failed = RequestOutput("r3")
    failed.put(None, "", "error", Usage(3, 0, 0, 0), "boom")
    assert failed.take_nowait().error == "boom"


async def test_a_consumer_that_falls_behind_takes_the_steps_it_missed_at_once():
    out = RequestOutput("r4")
    first = asyncio.ensure_future(out.take())  # waiting before anything was put
    out.put(1, "a")
    out.put(2, "b")  # put before the consumer ran: merged with the first
    assert (await first).token_ids == [1, 2]
    out.put(3, "c", "stop", Usage(1, 3, 0, 0))
    last = await out.take()
    assert (last.token_ids, last.text, last.finish_reason) == ([3], "c", "stop")
