"""The toy world and its programmatic rewards."""

import pytest
import torch

from digenrl.rewards.toy import JpegCompressibility, JpegIncompressibility, ToyGenEval
import numpy as np

from digenrl.toy.world import SHAPES, ToyPrompt, all_prompts, mislabel, sample_batch, shape_mask, split_prompts


def test_prompt_grammar_round_trips_and_split_is_disjoint():
    for p in all_prompts():
        assert ToyPrompt.parse(p.text) == p
    train, held = split_prompts()
    assert not set(train) & set(held) and len(train) + len(held) == len(all_prompts())
    assert 0.05 < len(held) / len(all_prompts()) < 0.3


def test_drawn_images_satisfy_their_prompts():
    imgs, texts = sample_batch(64, 32, seed=0, index=3)
    s = ToyGenEval().score(imgs, texts)
    assert s["reward"].mean() > 0.9 and s["strict"].mean() > 0.85
    assert torch.equal(s["color"], torch.ones(64))


def test_caption_noise_mislabels_each_attribute_at_its_rate_and_leaves_images_alone():
    noise = {"color": 0.2, "count": 0.4, "position": 0.4}
    exact_imgs, exact = sample_batch(2000, 32, seed=0, index=6)
    imgs, noisy = sample_batch(2000, 32, seed=0, index=6, caption_noise=noise)
    assert torch.equal(imgs, exact_imgs)  # captions are drawn after the images
    pairs = [(ToyPrompt.parse(a), ToyPrompt.parse(b)) for a, b in zip(exact, noisy)]
    for name, rate in noise.items():
        wrong = np.mean([getattr(a, name) != getattr(b, name) for a, b in pairs])
        assert abs(wrong - rate) < 0.04, (name, wrong)  # 2000 draws: 3 standard errors is ~0.033
    assert all(a.shape == b.shape for a, b in pairs)
    # exact captions, and a noisy caption scores far below the image's own
    assert sample_batch(8, 32, seed=0, index=6, caption_noise={})[1] == exact[:8]
    r = ToyGenEval()
    assert r(imgs, noisy).mean() < r(imgs, exact).mean() - 0.15


def test_mislabel_always_changes_a_noised_attribute_and_refuses_others():
    gen = np.random.default_rng(0)
    p = ToyPrompt("red", "circle", 2, "left")
    for _ in range(50):
        q = mislabel(p, {"color": 1.0, "position": 1.0}, gen)
        assert q.color != "red" and q.position != "left" and (q.shape, q.count) == ("circle", 2)
    assert mislabel(p, {"count": 1.0}, gen).count == 1
    with pytest.raises(ValueError, match="shape"):
        sample_batch(4, 32, seed=0, index=0, caption_noise={"shape": 0.5})


def test_wrong_prompts_and_empty_images_score_low():
    imgs, texts = sample_batch(64, 32, seed=0, index=4)
    r = ToyGenEval()
    right = r(imgs, texts).mean()
    assert r(imgs, texts[::-1]).mean() < right - 0.4
    assert r(torch.zeros_like(imgs), texts).max() < 0.3


def test_count_credit_rises_toward_the_asked_count():
    # one red square asked; images with 1, 2, 3 red squares
    p = ToyPrompt("red", "square", 1, "anywhere").text
    imgs = torch.zeros(3, 3, 32, 32)
    for i, n in enumerate((1, 2, 3)):
        for k in range(n):
            imgs[i, 0, 2 + 10 * k : 8 + 10 * k, 4:10] = 0.9
    count = ToyGenEval().score(imgs, [p] * 3)["count"]
    assert count.tolist() == pytest.approx([1.0, 0.5, 1 / 3])


def test_each_drawn_shape_matches_its_own_template_best():
    imgs, texts = sample_batch(240, 32, seed=0, index=5)
    specs = [ToyPrompt.parse(t) for t in texts]
    r = ToyGenEval()
    for drawn in SHAPES:
        idx = [i for i, p in enumerate(specs) if p.shape == drawn]
        scores = {
            asked: r.score(imgs[idx], [ToyPrompt(specs[i].color, asked, specs[i].count, specs[i].position).text
                                       for i in idx])["shape"].mean().item()
            for asked in SHAPES
        }
        assert max(scores, key=scores.get) == drawn, scores
        assert scores[drawn] > 0.85, scores


def test_a_ragged_blob_is_not_a_triangle():
    # half the pixels of a solid square, scattered in a checkerboard of 2x2 cells: a bounding-box
    # fill ratio of 1/2 would call it a triangle; pixel-wise template matching does not
    p = ToyPrompt("red", "triangle", 1, "anywhere").text
    blob = torch.zeros(1, 3, 32, 32)
    yy, xx = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    cells = ((yy // 2 + xx // 2) % 2 == 0) & (yy >= 8) & (yy < 20) & (xx >= 8) & (xx < 20)
    cells |= (yy >= 8) & (yy < 20) & (xx == 13)  # keep it one connected component
    blob[0, 0][cells] = 0.9
    tri = torch.zeros(1, 3, 32, 32)
    tri[0, 0][torch.from_numpy(shape_mask("triangle", 14.0, 14.0, 6.0, 32))] = 0.9
    r = ToyGenEval()
    assert r.score(blob, [p])["count"].item() == 1.0
    assert r.score(blob, [p])["shape"].item() < 0.6 < 0.85 < r.score(tri, [p])["shape"].item()


def test_jpeg_rewards_order_flat_below_noisy():
    flat = torch.full((1, 3, 32, 32), 0.5)
    noisy = torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(0))
    x = torch.cat([flat, noisy])
    assert JpegIncompressibility()(x, ["", ""])[1] > JpegIncompressibility()(x, ["", ""])[0]
    assert JpegCompressibility()(x, ["", ""])[0] > JpegCompressibility()(x, ["", ""])[1]


def test_jpeg_kb_is_the_size_of_round_255x_clamped_images_and_videos():
    """The quantisation (one temporary) and the contiguous HWC copy change nothing: each score is the
    size of PIL's JPEG of round(255 clamp(x, 0, 1)), out-of-range values and videos included."""
    import io

    from PIL import Image

    g = torch.Generator().manual_seed(3)
    x = torch.rand(3, 3, 16, 16, generator=g) * 1.4 - 0.2  # some pixels below 0 and above 1
    x[0] = 0.25
    video = torch.rand(2, 2, 3, 8, 8, generator=g)

    def reference_kb(frames: torch.Tensor) -> float:
        sizes = []
        for f in frames:
            buf = io.BytesIO()
            u8 = (f.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            Image.fromarray(u8).save(buf, format="JPEG", quality=95)
            sizes.append(buf.tell() / 1000.0)
        return sum(sizes) / len(sizes)

    assert torch.equal(JpegIncompressibility()(x, [""] * 3), torch.tensor([reference_kb(f[None]) for f in x]))
    assert torch.equal(JpegCompressibility()(video, ["", ""]), torch.tensor([-reference_kb(v) for v in video]))
