"""Step times the peers publish themselves, and the testbeds that reproduce their recipes.

The simulator's only check that no one here wrote: each `Figure` is a published number, the
recipe behind it (a Testbed: model, resolution, steps, batch sizes, GPUs, as the peer's
script sets them) and the shipped system that ran it (shipped.SYSTEMS). `predict(fig)` runs
that system's row on the testbed with the one global cost model; tests/sim/test_published.py
requires every prediction within +-25%, or names the cost that stays unexplained.

    python -m digenrl.sim.published      # the table in docs/measurements/simulator.md
"""

from __future__ import annotations

from dataclasses import dataclass, field

from digenrl.sim.shipped import MM, VO, VO_FT, VO_JUNE, VO_LORA, VO_NFT
from digenrl.sim.testbed import Testbed

TOLERANCE = 0.25


def _qwen_ocr(name: str, device: str, lora: bool, cfg: bool, gpus: int = 4, **kw) -> Testbed:
    """veRL-Omni's Qwen-Image OCR recipes: 32 prompts x 16 images at 512x512, 10 denoising steps,
    an SDE window of 2 trained steps, micro-batch 16, one request per image (the published runs
    set no max_num_seqs: vLLM-Omni generated serially), Qwen3-VL-8B as the OCR judge: asked for up
    to 4096 tokens (verl-project/verl-omni@a1139baf verl_omni/utils/reward_score/genrm_ocr.py:38),
    served by vLLM in eager mode (the reward rollout's default enforce_eager true), tensor-parallel
    over REWARD_TP=4 GPUs."""
    link = "nvlink-h800" if device == "H800" else "nvlink"
    d = dict(name=name, pools=[dict(name="gpus", count=gpus, device=device, role="any", gpus_per_node=8)],
             links=dict(intra_node=link, inter_node="ib-400g", inter_pool="ib-400g"),
             model="qwen-image-20b", height=512, width=512, denoise_steps=10, trained_steps=2,
             group_size=16, groups_per_step=32, micro_batch=16, rollout_batch=1, cfg=cfg, train_cfg=cfg,
             lora=lora, lora_rank=64, grad_ckpt=True, kl=False, reward="qwen3-vl-8b", text_tokens=256,
             judge_max_tokens=4096, judge_eager=True, judge_tp=4,
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
             # CLIP 77 + T5 at max_prompt_length 512 (leibniz-csi/mm_grpo@301f5c05
             # examples/flowgrpo_trainer/run_sd3.sh:7, run_sd3_fast.sh:7)
             text_tokens=77 + 512,
             weight_sync="lora-only")
    return Testbed.from_dict(d, source=name)


def _unirl_wan() -> Testbed:
    """UniRL PR 394's Wan2.1-1.3B setting, the shape of benchmarks/tsp_unirl.py: 16x H20, 48
    prompts x 16 videos at 720x1280, 5 frames, 14 denoising steps, 7 trained, its serial replay
    (1 sample per pass). GUESSES (the PR gives neither): a full fine-tune with checkpointing,
    PickScore, and no CFG in sampling or training: with CFG, the PR's own 460 s training phase
    would be 81% of the H20s' peak bf16 FLOP/s (768 x 7 x 3 (fwd+bwd) x 2 x 27.5 TFLOP over
    16 x 148 TFLOP/s = 374 s at 100%), and its 287 s of generation and reward 87%."""
    return Testbed.from_dict(dict(
        name="unirl-pr394-wan1.3b-h20x16", pools=[dict(name="h20", count=16, device="H20", role="any", gpus_per_node=8)],
        links=dict(intra_node="nvlink", inter_node="ib-400g", inter_pool="ib-400g"),
        model="wan2.1-1.3b", height=720, width=1280, frames=5, denoise_steps=14, trained_steps=7,
        group_size=16, groups_per_step=48, micro_batch=1, rollout_batch=1, cfg=False, train_cfg=False,
        lora=False, grad_ckpt=True, kl=False, reward="pickscore", weight_sync="nccl"), source="UniRL PR 394")


def _dance_flux() -> Testbed:
    """DanceGRPO's FLUX script (scripts/finetune/finetune_flux_grpo.sh): 2 nodes x 8 H800, one
    prompt per GPU (train_batch_size 1) x 12 generations at 720x720, 16 sampling steps, 60% of
    them trained (int(16 x 0.6) = 9), no CFG (cfg 0.0), a full fine-tune with gradient
    checkpointing, HPS-v2.1, sampling one image at a time (train_grpo_flux.py batch_size = 1)."""
    return Testbed.from_dict(dict(
        name="dancegrpo-flux-h800x16", pools=[dict(name="h800", count=16, device="H800", role="any", gpus_per_node=8)],
        links=dict(intra_node="nvlink-h800", inter_node="ib-400g", inter_pool="ib-400g"),
        model="flux.1-12b", height=720, width=720, denoise_steps=16, trained_steps=9, group_size=12,
        groups_per_step=16, micro_batch=1, rollout_batch=1, cfg=False, train_cfg=False, lora=False,
        grad_ckpt=True, kl=False, reward="hpsv2", weight_sync="nccl"), source="DanceGRPO README")


DG = "XueZeyue/DanceGRPO@15cc71d"
UNIRL = "Tencent-Hunyuan/UniRL pull request 394"

# What the model lacks on the H20 (UniRL): its compute costs are the H200's scaled by peak bf16
# FLOP/s (devices.scale_seconds: 989 / 148), i.e. the same fraction of peak on both parts.
H20_GAP = ("the H20's compute priced as the H200's at the same fraction of peak (devices.scale_seconds: x 989/148); "
           "a part with 148 TFLOP/s over 4.0 TB/s keeps its tensor cores fed better than the H200, so it runs "
           "compute-bound kernels nearer its peak: training (631 s) and generation + reward (393 s) are "
           "both about a third over the PR's phase times (460 s and 287 s)")


# What the model lacks for veRL-Omni's DiffusionNFT step: about 240 s, of which no mechanism read prices
# more than a quarter. Its citations are in verl-project/verl-omni@a1139baf:
# verl_omni/workers/engine/fsdp/diffusers_impl.py:1201-1229 and
# verl_omni/trainer/diffusion/ray_diffusion_trainer.py:1657-1661.
NFT_GAP = ("about 240 s a step: the judge explains at most ~54 s (if one answer per step ran to max_tokens) and "
           "the tenth trained timestep the testbed leaves out ~24 s; the update's old-adapter, trained and "
           "reference forwards per (micro-batch, timestep) are priced (diffusers_impl.py:1201-1229), the "
           "trainer's separate reference phase (ray_diffusion_trainer.py:1657-1661) and the adapter swaps "
           "inside the FSDP-wrapped module are not: not read further")


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
    new: str = ""  # the issue that added it ("issue 24": the scale check; "issue 39"); "": checked before
    upper_bound: bool = False  # the peer publishes "at most" this step time: only a slower prediction misses
    guesses: str = ""  # what the recipe does not say and the testbed guesses (the table prints it)

    def within(self, predicted_s: float) -> bool:
        """The prediction inside the tolerance: within +-TOLERANCE, or under (1 + TOLERANCE) x an upper bound."""
        err = predicted_s / self.published_step_s() - 1.0
        return err <= TOLERANCE if self.upper_bound else abs(err) <= TOLERANCE

    def published_step_s(self) -> float:
        if self.unit == "s/step":
            return self.value
        gpus = self.testbed.n_gpus + self.reward_gpus
        return self.testbed.samples_per_step / (self.value * gpus)


# What the model lacks at 64 GPUs (docs/measurements/simulator.md, "At scale: T(N) = C + W / N"). The
# two full fine-tune figures read T(N) = C + W / N: published C ~ 95 s, W ~ 620 GPU-s; the model's
# W is within 10% of that, its C about half, with the judge priced from first principles. Its
# genrm_ocr.py:38 is verl-project/verl-omni@a1139baf verl_omni/utils/reward_score/genrm_ocr.py:38.
SCALE_GAP = ("a per-step cost that does not shrink with the GPU count, ~48 s at 64 GPUs. The Qwen3-VL-8B judge's "
             "decode is priced (its step's longest answer, at the expected answer length); it would explain the "
             "gap if one answer per step ran to max_tokens 4096 (genrm_ocr.py:38; the 'step if one answer ran "
             "to max_tokens' column), as a repetition loop does, but no rate of such answers is published")

FIGURES = (
    Figure("verl-omni qwen-image full FT, 4x H200", "verl-omni@2026-05", 250.0, "s/step",
           f"{VO}:docs/algo/performance.md:51 (recipe {VO_FT}:examples/flowgrpo_trainer/run_qwen_image_ocr.sh)",
           _qwen_ocr("verl-omni-qwen-full-h200x4", "H200", lora=False, cfg=False)),
    Figure("verl-omni qwen-image full FT, 64x H100 (FSDP1)", "verl-omni@2026-06", 105.0, "s/step",
           f"{VO_JUNE}:docs/algo/performance.md:85 (recipe {VO_JUNE}:examples/flowgrpo_trainer/run_qwen_image_ocr.sh "
           "with NUM_GPUS=64 NUM_NODES=8; performance.md:87 for the offload settings)",
           _qwen_ocr("verl-omni-qwen-full-h100x64", "H100", lora=False, cfg=False, gpus=64),
           unexplained=SCALE_GAP, new="issue 24"),
    Figure("verl-omni qwen-image LoRA 64, 4x H800, reward on the same GPUs", "verl-omni@2026-05", 420.0, "s/step",
           f"{VO}:docs/algo/performance.md:16 (recipe {VO_LORA}:examples/flowgrpo_trainer/run_qwen_image_ocr_lora.sh)",
           _qwen_ocr("verl-omni-qwen-lora-h800x4", "H800", lora=True, cfg=True)),
    Figure("verl-omni qwen-image LoRA 64, 4x H800, async reward on a 5th GPU", "verl-omni@2026-05-async-reward", 360.0,
           "s/step",
           f"{VO}:docs/algo/performance.md:17 (recipe {VO}:examples/flowgrpo_trainer/qwen_image/"
           "run_qwen_image_ocr_lora_async_reward.sh)",
           _qwen_ocr("verl-omni-qwen-lora-h800x4-async-reward", "H800", lora=True, cfg=True, judge_tp=1,
                     judge_eager=False), reward_gpus=1),
    Figure("verl-omni qwen-image DiffusionNFT LoRA 64, 4x H200", "verl-omni@2026-06-nft", 570.0, "s/step",
           f"{VO}:examples/diffusionnft_trainer/README.md:145 (24 prompts x 16 = 384 images, 0.166 images/GPU/s; "
           f"recipe {VO}:examples/diffusionnft_trainer/qwen_image/run_qwen_image_ocr_lora.sh). Its "
           f"docs/algo/performance.md:127 row (550 s) gives 12 images per prompt, which does not match its own "
           "0.175 images/GPU/s (24 x 12 / (4 x 550) = 0.131; 24 x 16: 0.175): 16 it is",
           _qwen_ocr("verl-omni-nft-qwen-lora-h200x4", "H200", lora=True, cfg=False, groups_per_step=24,
                     # timestep_fraction 1.0 trains 10 timesteps; a testbed's window holds at most 9 of
                     # 10 (sampling.window_size): the tenth is left out (~10% of the training passes)
                     micro_batch=12, trained_steps=9, kl=True, old_forward=True), unexplained=NFT_GAP,
           new="issue 39", guesses="9 of its 10 trained timesteps (a testbed's window holds 9 of 10)"),
    Figure("UniRL Wan2.1-1.3B, 16x H20, serial replay", "colocated-ideal", 747.4, "s/step",
           f"{UNIRL} (description: 747.4 s per step, 460.0 s training, serial replay); the shape of "
           "benchmarks/tsp_unirl.py", _unirl_wan(), unexplained=H20_GAP, new="issue 39",
           guesses="full fine-tune, checkpointing, PickScore, no CFG (the PR gives none)"),
    Figure("DanceGRPO FLUX full FT, 16x H800 (at most)", "colocated-ideal", 12 * 3600 / 200, "s/step",
           f"{DG}:README.md:140 (200 iterations within 12 hours; recipe {DG}:scripts/finetune/finetune_flux_grpo.sh:21-59)",
           _dance_flux(), new="issue 39", upper_bound=True),
    Figure("mm_grpo SD3.5-M Flow-GRPO, 8x H800", "mm_grpo", 0.4, "img/s/GPU",
           f"{MM}:examples/flowgrpo_trainer/README.md:45 (script run_sd3.sh)", _sd35_ocr("mm-grpo-sd35-h800x8", False)),
    Figure("mm_grpo SD3.5-M Flow-GRPO-Fast, 8x H800", "mm_grpo", 1.0, "img/s/GPU",
           f"{MM}:examples/flowgrpo_trainer/README.md:46 (script run_sd3_fast.sh)",
           _sd35_ocr("mm-grpo-sd35-fast-h800x8", True)),
)


def predict(fig: Figure, steps: int = 6, cm=None) -> dict:
    """The row's steady-state step time on the figure's recipe, its breakdown, and the judge's decode.

    fig.system is a shipped system (shipped.SYSTEMS) or colocated-ideal, the bound of a colocated
    system with no avoidable overhead (a peer whose mechanisms are not modelled: the check is then
    that the peer is not faster than that bound). judge_* : a generative judge's longest answer
    (tokens), one decode step, and the step if the longest answer ran to max_tokens instead."""
    from digenrl.sim.catalogue import get_judge, longest_answer
    from digenrl.sim.costs import JudgeServing, default_cost_model
    from digenrl.sim.report import run_spec
    from digenrl.sim.shipped import SYSTEMS, fit
    from digenrl.sim.workload import RunSpec

    cm = cm or default_cost_model()
    # The recipe's own data parallelism: every GPU its share of the step's samples, each sample's
    # trained steps on the GPU that holds it (the peers' update loops), not a planner's choice.
    # The recipe ran: simulate it even where memory.py says it does not fit, and say so (`fits`).
    tb = fig.testbed
    spec = RunSpec("colocated", micro_batch_groups=-(-tb.samples_per_step // tb.n_gpus), samples_per_group=1,
                   tsp_chunk=tb.trained_steps, style=fig.system)
    r = run_spec(tb, spec, steps, cm, check_memory=False)
    want = fig.published_step_s()
    dev = tb.pools[0].device
    if fig.system in SYSTEMS:
        ok, peak, usable = fit(cm, SYSTEMS[fig.system], tb, dev, tb.n_gpus)
    else:
        ok, peak, usable = None, 0.0, 0.0  # colocated-ideal picks a layout that fits, or refuses
    out = {"figure": fig.key, "system": fig.system, "published_s": want, "predicted_s": r.step_s,
           "error": r.step_s / want - 1.0, "breakdown_s": r.breakdown_s, "overhead_ws": r.overhead_ws,
           "source": fig.source, "gpus": tb.n_gpus + fig.reward_gpus, "fits": ok, "peak_gib": peak,
           "usable_gib": usable, "within": fig.within(r.step_s)}
    judge = get_judge(tb.reward)
    if judge is not None:
        serving = JudgeServing.of(tb)
        n = tb.samples_per_step if SYSTEMS.get(fig.system) and SYSTEMS[fig.system].reward == "phase" else tb.n_gpus
        token_s = float(cm.judge_token_s(tb.reward, dev, serving.tp, serving.eager, serving.link))
        decode = r.breakdown_s.get("judge", 0.0)
        at_cap = (serving.max_tokens or 0) * token_s
        out.update(judge_tokens=longest_answer(judge, n, serving.max_tokens), judge_token_s=token_s,
                   judge_decode_s=decode, step_at_max_tokens_s=r.step_s - decode + at_cap if at_cap else None)
    return out


def table(rows: list[dict]) -> str:
    """Markdown: figure, GPUs, published, predicted, error, the prediction's terms with the judge's
    decode on its own, whether the memory model holds the recipe, and what the model lacks where it
    is out of tolerance."""
    out = ["| figure | GPUs | system | published s/step | predicted s/step | error | prediction: gen / reward / "
           "train / opt / overhead / comm | judge decode: longest answer x step = s | step if one answer ran to "
           "max_tokens | memory model | new | guesses | unexplained |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    figs = {f.key: f for f in FIGURES}
    for r in rows:
        b, f = r["breakdown_s"], figs.get(r["figure"])
        parts = " / ".join(f"{b.get(k, 0.0):.1f}" for k in ("generate", "reward", "train", "optimizer", "overhead",
                                                            "comm"))
        mem = ("not checked (ideal)" if r["fits"] is None else "fits" if r["fits"]
               else f"{r['peak_gib']:.0f} of {r['usable_gib']:.0f} GiB")
        judge = (f"{r['judge_tokens']:.0f} tok x {1e3 * r['judge_token_s']:.1f} ms = {r['judge_decode_s']:.1f}"
                 if "judge_tokens" in r else "-")
        cap = f"{r['step_at_max_tokens_s']:.0f}" if r.get("step_at_max_tokens_s") else "-"
        pub = f"<= {r['published_s']:.0f}" if f and f.upper_bound else f"{r['published_s']:.0f}"
        guesses = [f.guesses] if f and f.guesses else []
        if "judge_tokens" in r:  # the judge's estimates (catalogue.JUDGES, EAGER_LAYER_S)
            guesses.append("judge: mean answer of 30 tokens, memoryless length"
                           + (", eager 0.34 ms a layer" if f and f.testbed.judge_eager else ""))
        out.append(f"| {r['figure']} | {r['gpus']} | {r['system']} | {pub} | {r['predicted_s']:.0f} | "
                   f"{100 * r['error']:+.0f}% | {parts} | {judge} | {cap} | {mem} | {f.new if f else ''} | "
                   f"{'; '.join(guesses)} | {f.unexplained if f and not r['within'] else ''} |")
    return "\n".join(out)


def main() -> None:
    print(table([predict(f) for f in FIGURES]))


if __name__ == "__main__":
    main()
