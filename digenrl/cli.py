"""`digenrl` command line: train, and the tools around it.

    digenrl train [--config FILE] [--steps N] [--seed S] [--run-dir DIR] [--resume] [key=value ...]
    digenrl pretrain-toy [--steps N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Optional

from digenrl.config import ConfigError, load_config


def _train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    if args.run_dir is not None:
        overrides.append(f"run.run_dir={args.run_dir}")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"digenrl train: invalid configuration: {e}", file=sys.stderr)
        return 2
    from digenrl.trainer import Trainer

    print(f"digenrl train: model={cfg.model.name} mode={cfg.run.mode} steps={cfg.train.steps} "
          f"samples/step={cfg.data.groups_per_step * cfg.data.group_size} run_dir={cfg.run.run_dir}")
    summary = Trainer(cfg, progress=not args.quiet).train(resume=args.resume)
    before, after = summary["eval_reward_before"], summary["eval_reward_after"]
    print("\n== summary ==")
    if before is not None and after is not None:
        print(f"held-out eval reward: {before:.4f} (base) -> {after:.4f} after {summary['steps']} steps "
              f"({after - before:+.4f})")
    print(f"wall time: {summary['wall_s']:.1f} s of RL steps")
    print(f"run dir:   {summary['run_dir']}  (metrics.jsonl, tensorboard/, samples/, checkpoints/)")
    print(f"policy:    {summary['final_policy']}")
    print(f"plot:      {summary['reward_plot']}")
    return 0


def _pretrain_toy(args: argparse.Namespace) -> int:
    from pathlib import Path

    from digenrl.toy.pretrain import ASSET, pretrain, save_base

    model = pretrain(steps=args.steps, seed=args.seed)
    out = Path(args.out) if args.out else ASSET
    save_base(model, out)
    print(f"saved {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="digenrl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="RL post-training (GRPO) of a flow-matching generator")
    t.add_argument("--config", help="YAML config (see recipes/)")
    t.add_argument("--steps", type=int, help="RL steps (train.steps)")
    t.add_argument("--seed", type=int, help="run.seed")
    t.add_argument("--run-dir", help="run.run_dir: where metrics, checkpoints and samples go")
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run dir")
    t.add_argument("--quiet", action="store_true", help="no progress bar or per-step lines")
    t.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. train.lr=3e-4")
    t.set_defaults(func=_train)

    p = sub.add_parser("pretrain-toy", help="rebuild the toy world's base generator")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output .safetensors (default: the shipped asset)")
    p.set_defaults(func=_pretrain_toy)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
