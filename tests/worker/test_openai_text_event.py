"""ResponseShape.text_event: the bytes-only per-delta SSE event equals the dict-built one."""

from hypothesis import given
from hypothesis import strategies as st

from worker.openai.responses import ResponseShape, sse

SHAPES = [ResponseShape.new(kind, f"{kind}-3f2a", model)
          for kind in ("completion", "chat") for model in ("tiny", 'we"ird\\model')]


@given(st.text())
def test_text_event_is_the_chunk_of_that_text(text):
    for shape in SHAPES:
        assert shape.text_event(text) == sse(shape.chunk(text))
