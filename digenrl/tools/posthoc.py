"""`digenrl sample` and `digenrl eval`: a run's saved weights, after the run.

    digenrl sample --run-dir DIR [--step N|final | --base] [--prompts SPEC] [--samples K]
                   [--steps S] [--seed X] [--ema] [--set key=value ...] [--out DIR]
    digenrl eval   --run-dir DIR [--step N|final] [--prompts SPEC] [--rewards a,b] [--samples K]
                   [--steps S] [--seed X] [--ema] [--set key=value ...] [--out DIR]

Without --prompts, both take the run's own held-out prompts, the ones its evaluation used
(data.eval_prompts as the run resolved it, the first data.eval_max_prompts). Without --out,
they write to DIR/sample/<weights> or DIR/eval/<weights> (final, step_N, base).

Both sample as the run's held-out evaluation does (digenrl.train.evaluation.Evaluator): the
deterministic ODE sampler, from noise fixed by (seed, prompt index, sample index), so
sample j of prompt i gets the same noise under every set of weights and every call.
`eval` samples the base model and the chosen weights on that same noise and compares
them per reward, paired sample by sample (digenrl.math.paired).

Every input is checked before a model loads: the run directory, the step (the error lists
those there are), the prompts, the overrides and the rewards.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

from digenrl.config.errors import ConfigError
from digenrl.config.schema import Config
from digenrl.io.runs import BASE, RunError, Snapshot, resolve_snapshot, run_config


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", required=True, help="a digenrl train run directory (has config.json)")
    p.add_argument("--step", default="final", help="final (default), a checkpoint's RL step, or 0 = the base model")
    p.add_argument("--prompts", default=None,
                   help="toy, toy-held-out, a named set (a bare name: its test split; NAME:SPLIT) or a prompt file "
                        "(digenrl.data.load_rows; .jsonl rows carry images); default: the run's held-out prompts, "
                        "as its evaluation used them (data.eval_prompts, the first data.eval_max_prompts)")
    p.add_argument("--samples", type=int, default=4, help="samples per prompt (default 4)")
    p.add_argument("--steps", type=int, default=None, help="ODE denoising steps (default: the run's "
                                                            "sampling.eval_num_steps)")
    p.add_argument("--seed", type=int, default=None, help="noise seed (default: the run's run.seed)")
    p.add_argument("--ema", action="store_true", help="the EMA weights of the step (runs with train.ema_decay > 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the run's config, e.g. model.path=/new/place (repeatable)")
    p.add_argument("--out", default=None, help="output folder (default: RUN_DIR/<command>/<weights>: final, step_N "
                                                "or base)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


class Inputs:
    """Everything a command needs, checked before any model loads."""

    def __init__(self, args: argparse.Namespace, step: str, command: str = "sample"):
        from digenrl.data import check_conditioning, load_rows

        run_dir = Path(args.run_dir)
        self.snap: Snapshot = resolve_snapshot(run_dir, step)
        if args.samples < 1:
            raise RunError(f"--samples: must be >= 1, got {args.samples}")
        overrides = list(args.set) + [f"data.eval_samples={args.samples}"]
        if args.steps is not None:
            overrides.append(f"sampling.eval_num_steps={args.steps}")
        if args.seed is not None:
            overrides.append(f"run.seed={args.seed}")
        self.cfg: Config = run_config(run_dir, overrides)  # ConfigError names the key
        given = args.prompts is not None
        spec = args.prompts if given else self.cfg.data.held_out_prompts()
        what = "--prompts" if given else f"--prompts (the run's held-out prompts, {spec})"
        try:
            rows = load_rows(spec, held_out=True)
        except (ValueError, OSError) as e:
            raise RunError(f"{what}: {e}") from None
        cut = len(rows.prompts) if given else self.cfg.data.eval_max_prompts  # as the run's evaluation
        self.prompts = rows.prompts[:cut]
        self.images = None if rows.images is None else rows.images[:cut]  # conditioned families
        try:
            check_conditioning(rows, self.cfg.model.name, what)
        except ValueError as e:
            raise RunError(str(e)) from None
        if args.ema:
            _check_ema(self.snap)
        self.ema = args.ema
        self.out = Path(args.out) if args.out is not None else run_dir / command / _folder(self.snap)
        self.progress = not args.quiet


def _folder(snap: Snapshot) -> str:
    """The default output folder's last part for these weights: final, step_N or base."""
    if snap.path is None:
        return "base"
    return "final" if snap.label == "final" else f"step_{snap.step}"


def _check_ema(snap: Snapshot) -> None:
    from digenrl.io.checkpoint import is_sharded

    if snap.path is None:
        raise RunError("--ema: the base model (step 0) has no EMA weights")
    if not is_sharded(snap.path) and not (snap.path / "ema.safetensors").exists():
        raise RunError(f"--ema: {snap.name} has no ema.safetensors (the run had train.ema_decay 0)")


def sample_images(inputs: Inputs, policy, snap: Snapshot, rewarder=None, bar=None):
    """Run the Evaluator on `inputs.prompts` with `policy`: (its Evaluator, after evaluate)."""
    from digenrl.train.evaluation import Evaluator

    ev = Evaluator(inputs.cfg, policy, rewarder, prompts=inputs.prompts, images=inputs.images)
    ev.evaluate(snap.step, save_images=False, keep_images=rewarder is None, bar=bar)
    return ev


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="sample", disable=None if progress else True)  # None: off in a file


# -- digenrl sample ---------------------------------------------------------------------------
def sample_main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="digenrl sample", description="images (or videos) of a run's saved weights")
    _common(p)
    p.add_argument("--base", action="store_true", help="the base model: the same as --step 0")
    args = p.parse_args(argv)
    try:
        inputs = Inputs(args, BASE if args.base else args.step)
    except (RunError, ConfigError) as e:
        print(f"digenrl sample: {e}", file=sys.stderr)
        return 2
    from digenrl.io.runs import load_policy

    snap, k = inputs.snap, inputs.cfg.data.eval_samples
    policy = load_policy(inputs.cfg, snap, ema=inputs.ema, progress=inputs.progress)
    with _bar(len(inputs.prompts) * k, f"sample {snap.name}", inputs.progress) as bar:
        ev = sample_images(inputs, policy, snap, bar=bar)
    files = write_samples(ev.last_images, inputs, k, audio=ev.last_audio, audio_rate=ev.audio_rate)
    print(f"digenrl sample: {len(files)} samples of {snap.name} -> {inputs.out} (grid.png, samples.json)")
    return 0


def write_samples(images, inputs: Inputs, k: int, audio=None, audio_rate: Optional[int] = None) -> list[str]:
    """One file per sample (p<prompt>_s<sample>.png / .gif), grid.png and samples.json; with
    `audio` (N, channels, samples) at `audio_rate` Hz (audio families), a .wav beside each .gif."""
    from digenrl.io.media import save_prompt_grid, save_sample, save_wav

    inputs.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, prompt in enumerate(inputs.prompts):
        for j in range(k):
            name = inputs.out / f"p{i:04d}_s{j:02d}"
            f = save_sample(images[i * k + j], name)
            row = {"file": f.name, "prompt": prompt, "prompt_index": i, "sample": j}
            if audio is not None:
                row["audio"] = save_wav(audio[i * k + j], name, audio_rate).name
            rows.append(row)
    save_prompt_grid(images, inputs.prompts, k, inputs.out / "grid.png")
    (inputs.out / "samples.json").write_text(json.dumps({**_meta(inputs), "samples": rows}, indent=1))
    return [r["file"] for r in rows]


def _meta(inputs: Inputs) -> dict[str, Any]:
    c = inputs.cfg
    return {"weights": inputs.snap.name, "step": inputs.snap.step, "ema": inputs.ema, "seed": c.run.seed,
            "num_steps": c.sampling.eval_num_steps, "samples_per_prompt": c.data.eval_samples,
            "model": {"name": c.model.name, "path": c.model.path}}


# -- digenrl eval -----------------------------------------------------------------------------
def eval_main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="digenrl eval",
                                description="base vs trained weights on the same prompts and noise, per reward")
    _common(p)
    p.add_argument("--rewards", default=None, help="comma-separated reward names (default: the run's "
                                                    "reward.weights); model rewards read reward.paths.<name>")
    args = p.parse_args(argv)
    try:
        inputs = Inputs(args, args.step, "eval")
        names = reward_names(args.rewards, inputs.cfg)
    except (RunError, ConfigError) as e:
        print(f"digenrl eval: {e}", file=sys.stderr)
        return 2
    report = run_eval(inputs, names)
    print(markdown_table(report), end="")
    print(f"digenrl eval: {report['weights']} vs base -> {inputs.out / 'eval.json'}, {inputs.out / 'eval.md'}")
    return 0


def reward_names(spec: Optional[str], cfg: Config) -> list[str]:
    """--rewards as a list, checked as reward.weights is (name known, model path set)."""
    from digenrl.rewards import BUILTIN_REWARDS, REWARD_NAMES

    names = [n.strip() for n in spec.split(",") if n.strip()] if spec else list(cfg.reward.weights)
    if not names:
        raise RunError("--rewards: name at least one reward")
    for n in names:
        if n not in REWARD_NAMES:
            raise RunError(f"--rewards: {n!r} is unknown; choose from: {', '.join(REWARD_NAMES)}")
        if n not in BUILTIN_REWARDS and n not in cfg.reward.paths:
            raise RunError(f"--rewards: {n!r} loads a model: add --set reward.paths.{n}=<local model folder>")
    if len(set(names)) != len(names):
        raise RunError(f"--rewards: a reward is named twice: {names}")
    return names


def run_eval(inputs: Inputs, names: list[str]) -> dict[str, Any]:
    """Sample base and chosen weights on the same noise, score, compare; writes eval.json
    and eval.md under inputs.out and returns the report."""
    from digenrl.math.paired import paired_stats
    from digenrl.rewards import AsyncRewarder, build_reward
    from digenrl.io.runs import load_policy, load_snapshot

    cfg, snap, k = inputs.cfg, inputs.snap, inputs.cfg.data.eval_samples
    rewarder = AsyncRewarder({n: build_reward(n, cfg.reward.paths, cfg.model.device) for n in names},
                             {n: 1.0 for n in names}, threads=1)
    base_snap = Snapshot(BASE, 0, None)
    try:
        policy = load_policy(cfg, base_snap, progress=inputs.progress)
        with _bar(2 * len(inputs.prompts) * k, f"eval base + {snap.name}", inputs.progress) as bar:
            base = sample_images(inputs, policy, base_snap, rewarder, bar).last_parts
            if snap.path is not None:  # else base against itself: a second, identical pass
                load_snapshot(policy, snap, ema=inputs.ema)
            trained = sample_images(inputs, policy, snap, rewarder, bar).last_parts
    finally:
        rewarder.close()
    rewards = {}
    for n in names:  # each reward, then the sub-scores it reports (toy-geneval/strict, ...)
        for key in [n, *(k for k in base if k.startswith(n + "/"))]:
            b, t = base[key].tolist(), trained[key].tolist()
            rewards[key] = {**paired_stats(b, t), "base": b, "trained": t}
    report = {**_meta(inputs), "weights": snap.name, "prompts": len(inputs.prompts),
              "samples": [{"prompt": p, "prompt_index": i, "sample": j}
                          for i, p in enumerate(inputs.prompts) for j in range(k)],
              "rewards": rewards}
    inputs.out.mkdir(parents=True, exist_ok=True)
    (inputs.out / "eval.json").write_text(json.dumps(report, indent=1))
    (inputs.out / "eval.md").write_text(markdown_table(report))
    return report


def markdown_table(report: dict[str, Any]) -> str:
    """One row per reward and sub-score: n, base mean, trained mean, paired mean diff, its se, paired t."""
    def num(v: Optional[float], fmt: str = ".4f") -> str:
        return "n/a" if v is None else format(v, fmt)

    lines = [f"{report['weights']} vs base, {report['prompts']} prompts x {report['samples_per_prompt']} "
             f"samples, same noise (seed {report['seed']}, {report['num_steps']} ODE steps)", "",
             "| reward | n | base | trained | diff (trained - base) | se | t |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in report["rewards"].items():
        lines.append(f"| {name} | {r['n']} | {num(r['base_mean'])} | {num(r['trained_mean'])} | "
                     f"{num(r['mean_diff'], '+.4f')} | {num(r['se'])} | {num(r['t'], '.2f')} |")
    return "\n".join(lines) + "\n"
