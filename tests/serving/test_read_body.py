"""read_body's deadline when the event loop was busy past it (a reward batch on the loop)."""

import asyncio
import time

import pytest

from digenrl.runtime.serving.reward_app import RequestError, read_body


class _StalledRequest:
    """Half the body, then the event loop held past the read deadline (as a reward batch on the
    loop holds it), then the rest: the timer cannot fire while the loop is held."""

    def __init__(self, body: bytes, hold_s: float):
        self.headers = {"content-length": str(len(body))}
        self.body, self.hold_s = body, hold_s

    async def stream(self):
        yield self.body[: len(self.body) // 2]
        time.sleep(self.hold_s)  # blocks the loop: nothing else runs, no timer fires
        yield self.body[len(self.body) // 2:]


def test_a_body_complete_only_after_the_deadline_is_a_408_even_when_the_loop_was_held():
    with pytest.raises(RequestError) as e:
        asyncio.run(read_body(_StalledRequest(b"x" * 64, hold_s=0.2), limit=1 << 20, read_timeout_s=0.05))
    assert e.value.status == 408
    # the same body inside its deadline is read whole
    assert asyncio.run(read_body(_StalledRequest(b"x" * 64, hold_s=0.0), limit=1 << 20, read_timeout_s=30.0)) == b"x" * 64
