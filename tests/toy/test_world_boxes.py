"""`draw_with_boxes` draws what `draw` draws, and its boxes bound the drawn objects."""

import numpy as np

from digenrl.toy.world import all_prompts, draw, draw_with_boxes


def test_same_image_as_draw_and_boxes_bound_each_object():
    for i, p in enumerate(all_prompts()[::7]):
        img = draw(p, 32, np.random.default_rng(i))
        img2, boxes = draw_with_boxes(p, 32, np.random.default_rng(i))
        assert np.array_equal(img, img2) and boxes.shape == (p.count, 4)
        covered = np.zeros((32, 32), dtype=bool)
        for x0, y0, x1, y1 in (boxes * 32).tolist():
            assert 0 <= x0 < x1 <= 32 and 0 <= y0 < y1 <= 32
            covered[int(np.floor(y0)) : int(np.ceil(y1)), int(np.floor(x0)) : int(np.ceil(x1))] = True
            # the toy world's object is 2r = 0.28 x 32 px across
            assert abs((x1 - x0) - 0.28 * 32) < 1e-3 or x0 == 0 or x1 == 32
        foreground = img.max(axis=0) > 0
        assert foreground.any() and not (foreground & ~covered).any()  # every drawn pixel lies in a box
