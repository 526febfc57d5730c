"""Step times the peers publish themselves, and the testbeds that reproduce their recipes.

The simulator's only check that no one here wrote: each `Figure` is a published number, the
recipe behind it (a Testbed: model, resolution, steps, batch sizes, GPUs, as the peer's
script sets them) and the shipped system that ran it (shipped.SYSTEMS). `predict(fig)` runs
that system's row on the testbed with the one global cost model; tests/sim/test_published.py
requires every prediction within +-25%, or names the cost that stays unexplained.

    python -m digenrl.sim.published      # the table in docs/simulator.md
"""

from __future__ import annotations

from dataclasses import dataclass, field

from digenrl.sim.shipped import MM, VO, VO_FT, VO_JUNE, VO_LORA
from digenrl.sim.testbed import Testbed

TOLERANCE = 0.25


def _qwen_ocr(name: str, device: str, lora: bool, cfg: bool, gpus: int = 4, **kw) -> Testbed:
    """veRL-Omni's Qwen-Image OCR recipes: 32 prompts x 16 images at 512x512, 10 denoising steps,
    an SDE window of 2 trained steps, micro-batch 16, one request per image (the published runs
    set no max_num_seqs: vLLM-Omni generated serially), Qwen3-VL-8B as the OCR judge."""
    link = "nvlink-h800" if device == "H800" else "nvlink"
    d = dict(name=name, pools=[dict(name="gpus", count=gpus, device=device, role="any", gpus_per_node=8)],
             links=dict(intra_node=link, inter_node="ib-400g", inter_pool="ib-400g"),
             model="qwen-image-20b", height=512, width=512, denoise_steps=10, trained_steps=2,
             group_size=16, groups_per_step=32, micro_batch=16, rollout_batch=1, cfg=cfg, train_cfg=cfg,
             lora=lora, lora_rank=64, grad_ckpt=True, kl=False, reward="qwen3-vl-8b", text_tokens=256,
             weight_sync="lora-only" if lora else "nccl")
    d.update(kw)
    return Testbed.from_dict(d, source=name)


def _sd35_ocr(name: str, fast: bool) -> Testbed:
    """mm_grpo's SD3.5-M OCR scripts (run_sd3.sh / run_sd3_fast.sh): 64 prompts x 16 images at
    512x512 on 8 H800, 10 steps, LoRA 32, no checkpointing, generation and training in batches of
    8; Flow-GRPO: CFG 4.5 (also in training), KL 0.04, 9 trained steps; Fast: no CFG, no KL, a
    window of 3. PaddleOCR on the CPU. Prompts padded to 512 T5 tokens."""
    d = dict(name=name, pools=[dict(name="gpus", count=8, device="H800", role="any", gpus_per_node=8)],
             links=dict(intra_node="nvlink-h800", inter_node="ib-400g", inter_pool="ib-400g"),
             model="sd3.5-medium", height=512, width=512, denoise_steps=10, trained_steps=3 if fast else 9,
             group_size=16, groups_per_step=64, micro_batch=8, rollout_batch=8, cfg=not fast,
             train_cfg=not fast, lora=True, lora_rank=32, grad_ckpt=False, kl=not fast, reward="ocr-cpu",
             text_tokens=77 + 512,  # CLIP 77 + T5 at max_prompt_length 512 (run_sd3*.sh:7)
             weight_sync="lora-only")
    return Testbed.from_dict(d, source=name)


@dataclass(frozen=True)
class Figure:
    """One published step time: `value` in `unit` (s/step or images/s/GPU), its source, the
    recipe's testbed, the system that ran it, and how many GPUs the published rate counts."""

    key: str
    system: str
    value: float
    unit: str  # "s/step" | "img/s/GPU"
    source: str
    testbed: Testbed = field(compare=False)
    reward_gpus: int = 0  # GPUs of an asynchronous reward pool beside the colocated ones
    unexplained: str = ""  # the cost this model does not explain, when the figure is out of tolerance
    new: bool = False  # added with issue 24 (the scale check); the others were checked before

    def published_step_s(self) -> float:
        if self.unit == "s/step":
            return self.value
        gpus = self.testbed.n_gpus + self.reward_gpus
        return self.testbed.samples_per_step / (self.value * gpus)


# What the model lacks at 64 GPUs (docs/simulator.md, "How far to trust a prediction at scale"). The
# two full fine-tune figures read T(N) = C + W / N: published C ~ 95 s, W ~ 620 GPU-s; the model's
# W is within 10% of that, its C about half. No mechanism read in the code prices the rest.
SCALE_GAP = ("a per-step cost that does not shrink with the GPU count, ~50 s at 64 GPUs: most likely the "
             "Qwen3-VL-8B judge served by vLLM with enforce_eager and max_tokens 4096 (genrm_ocr.py:38), whose "
             "decode time is set by the longest answer, not by FLOPs spread over the GPUs as priced here")

FIGURES = (
    Figure("verl-omni qwen-image full FT, 4x H200", "verl-omni@2026-05", 250.0, "s/step",
           f"{VO}:docs/algo/performance.md:51 (recipe {VO_FT}:examples/flowgrpo_trainer/run_qwen_image_ocr.sh)",
           _qwen_ocr("verl-omni-qwen-full-h200x4", "H200", lora=False, cfg=False)),
    Figure("verl-omni qwen-image full FT, 64x H100 (FSDP1)", "verl-omni@2026-06", 105.0, "s/step",
           f"{VO_JUNE}:docs/algo/performance.md:85 (recipe {VO_JUNE}:examples/flowgrpo_trainer/run_qwen_image_ocr.sh "
           "with NUM_GPUS=64 NUM_NODES=8; performance.md:87 for the offload settings)",
           _qwen_ocr("verl-omni-qwen-full-h100x64", "H100", lora=False, cfg=False, gpus=64),
           unexplained=SCALE_GAP, new=True),
    Figure("verl-omni qwen-image LoRA 64, 4x H800, reward on the same GPUs", "verl-omni@2026-05", 420.0, "s/step",
           f"{VO}:docs/algo/performance.md:16 (recipe {VO_LORA}:examples/flowgrpo_trainer/run_qwen_image_ocr_lora.sh)",
           _qwen_ocr("verl-omni-qwen-lora-h800x4", "H800", lora=True, cfg=True)),
    Figure("verl-omni qwen-image LoRA 64, 4x H800, async reward on a 5th GPU", "verl-omni@2026-05-async-reward", 360.0,
           "s/step",
           f"{VO}:docs/algo/performance.md:17 (recipe {VO}:examples/flowgrpo_trainer/qwen_image/"
           "run_qwen_image_ocr_lora_async_reward.sh)",
           _qwen_ocr("verl-omni-qwen-lora-h800x4-async-reward", "H800", lora=True, cfg=True), reward_gpus=1),
    Figure("mm_grpo SD3.5-M Flow-GRPO, 8x H800", "mm_grpo", 0.4, "img/s/GPU",
           f"{MM}:examples/flowgrpo_trainer/README.md:45 (script run_sd3.sh)", _sd35_ocr("mm-grpo-sd35-h800x8", False)),
    Figure("mm_grpo SD3.5-M Flow-GRPO-Fast, 8x H800", "mm_grpo", 1.0, "img/s/GPU",
           f"{MM}:examples/flowgrpo_trainer/README.md:46 (script run_sd3_fast.sh)",
           _sd35_ocr("mm-grpo-sd35-fast-h800x8", True)),
)


def predict(fig: Figure, steps: int = 6, cm=None) -> dict:
    """The shipped row's steady-state step time on the figure's recipe, and its breakdown."""
    from digenrl.sim.report import run_spec
    from digenrl.sim.workload import RunSpec

    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.shipped import SYSTEMS, fit

    cm = cm or default_cost_model()
    # The recipe's own data parallelism: every GPU its share of the step's samples, each sample's
    # trained steps on the GPU that holds it (the peers' update loops), not a planner's choice.
    # The recipe ran: simulate it even where memory.py says it does not fit, and say so (`fits`).
    tb = fig.testbed
    spec = RunSpec("colocated", micro_batch_groups=-(-tb.samples_per_step // tb.n_gpus), samples_per_group=1,
                   tsp_chunk=tb.trained_steps, style=fig.system)
    r = run_spec(tb, spec, steps, cm, check_memory=False)
    want = fig.published_step_s()
    ok, peak, usable = fit(cm, SYSTEMS[fig.system], fig.testbed, fig.testbed.pools[0].device, fig.testbed.n_gpus)
    return {"figure": fig.key, "system": fig.system, "published_s": want, "predicted_s": r.step_s,
            "error": r.step_s / want - 1.0, "breakdown_s": r.breakdown_s, "overhead_ws": r.overhead_ws,
            "source": fig.source, "gpus": fig.testbed.n_gpus + fig.reward_gpus, "fits": ok, "peak_gib": peak,
            "usable_gib": usable}


def table(rows: list[dict]) -> str:
    """Markdown: figure, GPUs, published, predicted, error, the prediction's terms, whether the
    memory model holds the recipe, and what the model lacks where it is out of tolerance."""
    out = ["| figure | GPUs | system | published s/step | predicted s/step | error | prediction: gen / reward / "
           "train / opt / overhead / comm | memory model | new | unexplained |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    figs = {f.key: f for f in FIGURES}
    for r in rows:
        b, f = r["breakdown_s"], figs.get(r["figure"])
        parts = " / ".join(f"{b.get(k, 0.0):.1f}" for k in ("generate", "reward", "train", "optimizer", "overhead",
                                                            "comm"))
        mem = "fits" if r["fits"] else f"{r['peak_gib']:.0f} of {r['usable_gib']:.0f} GiB"
        out.append(f"| {r['figure']} | {r['gpus']} | {r['system']} | {r['published_s']:.0f} | {r['predicted_s']:.0f} | "
                   f"{100 * r['error']:+.0f}% | {parts} | {mem} | {'yes' if f and f.new else ''} | "
                   f"{f.unexplained if f and abs(r['error']) > TOLERANCE else ''} |")
    return "\n".join(out)


def main() -> None:
    print(table([predict(f) for f in FIGURES]))


if __name__ == "__main__":
    main()
