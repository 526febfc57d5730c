"""The wire format without a server: uint8 bodies decode to pixel / 255 (no range scan needed);
float bodies outside [0, 1] or not finite are refused with a 400 naming the rule."""

import pytest
import torch
from safetensors.torch import save

from digenrl.rewards.wire import RequestError, decode_request, encode_request


def test_uint8_bodies_decode_to_pixel_over_255():
    x = torch.rand(3, 3, 8, 8)
    images, prompts, reward = decode_request(encode_request(x, ["a", "b", "c"], reward="r"))
    torch.testing.assert_close(images, (x * 255).round() / 255)
    assert (prompts, reward) == (["a", "b", "c"], "r")


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), float("inf")])
def test_float_bodies_outside_0_1_are_refused(bad):
    x = torch.rand(2, 3, 8, 8)
    x[1, 0, 0, 0] = bad
    body = save({"images": x}, metadata={"prompts": '["a", "b"]'})  # encode_request would clamp it
    with pytest.raises(RequestError, match=r"finite and in \[0, 1\]") as info:
        decode_request(body)
    assert info.value.status == 400
