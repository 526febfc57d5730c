"""A tiny OWLv2 trained on the toy world, so the geneval-detector reward can be measured.

    python -m digenrl.rewards.toy_detector [--steps N] [--out DIR] [--eval-images N]

trains `Owlv2ForObjectDetection` (a ~0.3M-parameter config, TOY_CONFIG) from random
weights on toy-world renders with their known boxes, the queries being the shape names
("square", "circle", "triangle"; colour is the reward's colour classifier's job, as in
GenEval), saves it as a transformers folder (the shipped one is `TOY_DETECTOR`, ~1 MB),
and prints the reward's accuracy on freshly drawn held-out images (`evaluate`).

Labels: the patch that holds an object's centre is the positive for its shape's query
(sigmoid focal loss on every patch x query); every patch whose centre lies inside an
object's box regresses that box (L1 + generalised IoU), so a neighbour that also fires
predicts the same box and NMS removes it.
"""

from __future__ import annotations

import argparse
import json
import math
import string
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from digenrl.math import rng
from digenrl.rewards.clip_models import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from digenrl.toy.world import COLORS, COUNTS, SHAPES, ToyPrompt, draw_with_boxes, split_prompts

TOY_DETECTOR = Path(__file__).resolve().parent.parent / "assets" / "toy_detector"
IMAGE_SIZE = 32  # the toy world's default render size
PATCH = 4  # 8 x 8 patches; two objects' centres are >= 2.4 r = 10.75 px apart, never in one patch
DETECTOR_DATA = 101  # rng stream of the detector's training images
EVAL_DATA = 102  # rng stream of its evaluation images, disjoint from training


def tiny_tokenizer():
    """A CLIP BPE tokenizer over single letters. Pad is id 0 ("!") as in OWL's vocabulary,
    since OWL masks a query whose first id is 0, and end-of-text is the highest id, since
    OWL pools the text at the argmax id."""
    from transformers import CLIPTokenizer

    vocab = {"!": 0}
    for suffix in ("", "</w>"):  # a letter inside a word, and at its end
        for c in string.ascii_lowercase + string.digits:
            vocab[c + suffix] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], pad_token="!")


def tiny_config(vocab_size: int, *, width: int = 64, layers: int = 3, text_width: int = 32, image_size: int = IMAGE_SIZE):
    """An Owlv2Config small enough to train on a CPU in minutes (projection = text width, as OWL needs)."""
    from transformers import Owlv2Config

    return Owlv2Config(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=text_width, intermediate_size=2 * text_width, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=16, bos_token_id=vocab_size - 2,
            eos_token_id=vocab_size - 1, pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers, num_attention_heads=4,
            image_size=image_size, patch_size=PATCH,
        ),
        projection_dim=text_width,
    )  # fmt: skip


def save_detector(model, path) -> str:
    """Write an OWLv2 folder the reward loads: weights + config, tokenizer, preprocessor_config.json."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    size = model.config.vision_config.image_size
    processor = {
        "image_processor_type": "Owlv2ImageProcessor", "do_resize": True, "size": {"height": size, "width": size},
        "do_pad": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(OPENAI_CLIP_MEAN), "image_std": list(OPENAI_CLIP_STD),
    }  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(processor, indent=1))
    return str(path)


def new_detector(seed: int, **config):
    from transformers import Owlv2ForObjectDetection

    torch.manual_seed(seed)
    model = Owlv2ForObjectDetection(tiny_config(len(tiny_tokenizer()), **config))
    # transformers leaves the detection heads at unit-variance weights (real OWL heads come
    # pretrained): box logits then saturate the sigmoid and never learn. Start them small,
    # with boxes at the grid bias and a class prior of sigmoid(-4) ~ 2% (RetinaNet's trick).
    heads = [model.box_head, model.objectness_head, model.class_head]
    with torch.no_grad():
        for lin in (mod for h in heads for mod in h.modules() if isinstance(mod, torch.nn.Linear)):
            lin.weight.normal_(0.0, 0.02)
            lin.bias.zero_()
        model.class_head.logit_shift.bias.fill_(-4.0)
    return model


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------


def draw_batch(prompts, batch: int, size: int, gen: np.random.Generator):
    """(images (B, 3, size, size), chosen ToyPrompts, per image its (count, 4) normalised xyxy boxes)."""
    chosen = [prompts[i] for i in gen.integers(0, len(prompts), size=batch)]
    drawn = [draw_with_boxes(p, size, gen) for p in chosen]
    return torch.from_numpy(np.stack([d[0] for d in drawn])), chosen, [d[1] for d in drawn]


def targets(chosen, boxes, grid: int):
    """Class targets (B, P, Q) with P = grid^2 patches (row-major) and Q = SHAPES; box targets
    (B, P, 4) cxcywh with their mask (B, P): patches whose centre lies in an object's box."""
    b = len(chosen)
    cls = torch.zeros(b, grid * grid, len(SHAPES))
    box = torch.zeros(b, grid * grid, 4)
    mask = torch.zeros(b, grid * grid, dtype=torch.bool)
    centres = (torch.arange(grid) + 0.5) / grid
    py, px = torch.meshgrid(centres, centres, indexing="ij")
    py, px = py.flatten(), px.flatten()  # (P,)
    for i, (p, bx) in enumerate(zip(chosen, boxes)):
        for x0, y0, x1, y1 in bx.tolist():
            cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
            centre = min(int(cy * grid), grid - 1) * grid + min(int(cx * grid), grid - 1)
            cls[i, centre, SHAPES.index(p.shape)] = 1.0
            inside = (px >= x0) & (px <= x1) & (py >= y0) & (py <= y1)
            inside[centre] = True
            box[i, inside] = torch.tensor([cx, cy, x1 - x0, y1 - y0])
            mask[i, inside] = True
    return cls, box, mask


def giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Generalised IoU of matched (N, 4) xyxy boxes -> (N,)."""
    area = lambda x: (x[:, 2:] - x[:, :2]).clamp(min=0).prod(-1)  # noqa: E731
    inter = (torch.minimum(a[:, 2:], b[:, 2:]) - torch.maximum(a[:, :2], b[:, :2])).clamp(min=0).prod(-1)
    union = area(a) + area(b) - inter
    hull = (torch.maximum(a[:, 2:], b[:, 2:]) - torch.minimum(a[:, :2], b[:, :2])).prod(-1)
    return inter / union - (hull - union) / hull


def train(steps: int = 3000, batch: int = 32, lr: float = 2e-3, seed: int = 0, threads: int = 1, progress: bool = True):
    """Train a tiny OWLv2 on toy renders of the training prompts; returns the model (eval mode).

    One torch thread by default, so the weights are a function of `seed` (float sums depend
    on the thread count). The shipped TOY_DETECTOR is this with its defaults: ~3.5 CPU-minutes.
    """
    from digenrl.rewards.detector import OwlPreprocess, cxcywh_to_xyxy

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = new_detector(seed).train()
        tok = tiny_tokenizer()
        q = tok(list(SHAPES), padding="max_length", max_length=16, return_tensors="pt")
        grid = IMAGE_SIZE // PATCH
        preprocess = OwlPreprocess((IMAGE_SIZE, IMAGE_SIZE))
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
        warmup = min(100, steps // 10)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda i: (i + 1) / warmup if i < warmup else 0.05 + 0.475 * (1 + math.cos(math.pi * (i - warmup) / max(1, steps - warmup)))
        )
        train_prompts, _ = split_prompts()
        start = time.time()
        for step in range(steps):
            gen = np.random.default_rng(rng.key(seed, DETECTOR_DATA, step))
            images, chosen, boxes = draw_batch(train_prompts, batch, IMAGE_SIZE, gen)
            noise = torch.from_numpy(gen.uniform(0, 0.05, (batch, 1, 1, 1)).astype(np.float32))
            images = (images + noise * torch.randn(images.shape, generator=torch.Generator().manual_seed(step))).clamp(0, 1)
            cls_t, box_t, mask = targets(chosen, boxes, grid)
            out = model(
                input_ids=q.input_ids.repeat(batch, 1), attention_mask=q.attention_mask.repeat(batch, 1),
                pixel_values=preprocess(images),
            )  # fmt: skip
            npos = cls_t.sum().clamp(min=1)
            focal = _sigmoid_focal(out.logits, cls_t).sum() / npos
            pred = out.pred_boxes[mask]  # (M, 4) cxcywh
            l1 = (pred - box_t[mask]).abs().sum(-1).mean()
            g = (1 - giou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(box_t[mask]))).mean()
            loss = focal + 5 * l1 + 2 * g  # DETR's box-loss weights
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if progress and (step % 100 == 0 or step == steps - 1):
                print(f"step {step:5d}  loss {loss.item():.3f}  focal {focal.item():.3f}  l1 {l1.item():.3f}  "
                      f"giou {g.item():.3f}  {time.time() - start:.0f}s", flush=True)  # fmt: skip
        return model.eval()
    finally:
        torch.set_num_threads(previous)


def _sigmoid_focal(logits: torch.Tensor, target: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0) -> torch.Tensor:
    """Focal loss (Lin et al. 2017) per element: most patch x query pairs are easy negatives."""
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    p_t = p * target + (1 - p) * (1 - target)
    return (alpha * target + (1 - alpha) * (1 - target)) * ce * (1 - p_t) ** gamma


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------


def mutate(p: ToyPrompt, kind: str, gen: np.random.Generator) -> ToyPrompt:
    """A prompt that differs from `p` in one attribute, so an image of it must fail `p`.

    Positions mirror (left <-> right, top <-> bottom): the drawn objects then lie wholly in
    the other half. `p` must not be "anywhere" for kind "position".
    """
    if kind == "count":
        return ToyPrompt(p.color, p.shape, 3 - p.count, p.position)
    if kind == "color":
        others = [c for c in COLORS if c != p.color]
        return ToyPrompt(others[gen.integers(len(others))], p.shape, p.count, p.position)
    if kind == "shape":
        others = [s for s in SHAPES if s != p.shape]
        return ToyPrompt(p.color, others[gen.integers(len(others))], p.count, p.position)
    mirror = {"left": "right", "right": "left", "top": "bottom", "bottom": "top"}
    return ToyPrompt(p.color, p.shape, p.count, mirror[p.position])


MUTATIONS = ("count", "color", "shape", "position")


def eval_set(n: int, seed: int, size: int = IMAGE_SIZE):
    """n (image, prompt it is scored against, prompt it was drawn from) triples; half faithful,
    half drawn from a one-attribute mutation. Prompts are the held-out ones (all positioned)."""
    _, held = split_prompts()
    gen = np.random.default_rng(rng.key(seed, EVAL_DATA))
    images, asked, drawn, boxes = [], [], [], []
    for i in range(n):
        p = held[gen.integers(len(held))]
        src = p if i % 2 == 0 else mutate(p, MUTATIONS[(i // 2) % len(MUTATIONS)], gen)
        img, bx = draw_with_boxes(src, size, gen)
        images.append(img), asked.append(p.text), drawn.append(src), boxes.append(bx)
    return torch.from_numpy(np.stack(images)), asked, drawn, boxes


def evaluate(reward, n: int = 200, seed: int = 0) -> dict[str, float]:
    """The reward's accuracy on n fresh held-out toy images (see `eval_set`).

    count: images whose detections of the drawn shape (score >= reward.threshold) number the drawn count.
    color: detections matched to a drawn box (IoU >= 0.5) whose colour is the drawn colour.
    strict: pairs whose strict score is the truth (1 faithful, 0 mutated); also split by kind.
    """
    from digenrl.rewards.detector import box_iou

    images, asked, drawn, boxes = eval_set(n, seed)
    dets = reward.detector.detect(images, [[p.shape] for p in drawn])
    count_ok, color_ok, color_n = 0, 0, 0
    for img, p, d, bx in zip(images, drawn, dets, boxes):
        kept = [x for x in d if x.score >= reward.threshold]
        count_ok += len(kept) == p.count
        if kept:
            iou = box_iou(torch.tensor([x.box for x in kept]), torch.from_numpy(bx))  # (K, count)
            matched = [x for x, best in zip(kept, iou.max(1).values) if best >= 0.5]
            names = reward.color(img, matched)
            color_ok += sum(c == p.color for c in names)
            color_n += len(matched)
    strict = reward.score(images, asked)["strict"]
    truth = torch.tensor([float(a == p.text) for a, p in zip(asked, drawn)])
    right = strict == truth
    out = {
        "images": float(n),
        "count_accuracy": count_ok / n,
        "color_accuracy": color_ok / max(color_n, 1),
        "strict_accuracy": float(right.float().mean()),
        "strict_accuracy_faithful": float(right[truth == 1].float().mean()),
        "strict_accuracy_mutated": float(right[truth == 0].float().mean()),
    }
    for i, kind in enumerate(MUTATIONS):  # mutated pairs sit at odd i, kinds in turn
        idx = [j for j in range(1, n, 2) if (j // 2) % len(MUTATIONS) == i]
        out[f"strict_accuracy_mutated_{kind}"] = float(right[idx].float().mean()) if idx else float("nan")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(TOY_DETECTOR))
    ap.add_argument("--eval-images", type=int, default=400)
    ap.add_argument("--eval-seed", type=int, default=1)
    args = ap.parse_args(argv)
    model = train(args.steps, args.batch, seed=args.seed, threads=args.threads)
    path = save_detector(model, args.out)
    from digenrl.rewards.detector import GenEvalDetector

    result = evaluate(GenEvalDetector(path), args.eval_images, args.eval_seed)
    print(json.dumps({"checkpoint": path, **{k: round(v, 4) for k, v in result.items()}}, indent=1))


if __name__ == "__main__":
    main()
