"""`digenrl` command line: train, and the tools around it.

    digenrl train [--config FILE] [--steps N] [--seed S] [--run-dir DIR] [--resume] [key=value ...]
    digenrl train --help-config     (every config key: type, default, description)
                  (key=value overrides may go anywhere among the options)
    digenrl pretrain-toy [--steps N] [--out FILE]
    digenrl reward-server SPEC [--replicas N] [--host H] [--port P] [--address A] [--token-file F] ...  (Ray Serve)
    digenrl prompts list | fetch NAME [--split train|test]   (named prompt sets: data.prompts=NAME)
    digenrl simulate --testbed FILE|PRESET      (each takes --help)
    digenrl plan --testbed FILE|PRESET --gpus N
    digenrl bench --real | --emulated --testbed X
    digenrl profile --model ... | --arch sd3|flux --random
    digenrl sample --run-dir DIR [--step N|final|--base] [--prompts SPEC] [--out DIR]
    digenrl eval --run-dir DIR [--step N|final] [--prompts SPEC] [--rewards a,b] [--out DIR]
    digenrl scale --run-dir DIR rollout=+N|-N|N [--allow-empty]   (a running Ray run's rollout pool)
    digenrl trace --run-dir DIR [--steps A:B] [--out DIR]   (trace.json, gantt.png from trace.jsonl)
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path
from typing import Optional

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.tools.preflight import check_inputs


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
        if args.address is not None:
            cfg.runtime.address = args.address
        check_inputs(cfg)  # the files the run will read: before Ray starts or a model loads
    except ConfigError as e:
        print(f"digenrl train: invalid configuration: {e}", file=sys.stderr)
        return 2
    lost: tuple[type[Exception], ...] = ()
    late: tuple[type[Exception], ...] = ()
    if cfg.run.mode == "local":
        from digenrl.train.trainer import Trainer as trainer_cls
    else:
        from digenrl.runtime.cluster import ClusterRefused
        from digenrl.runtime.driver import RayDriver as trainer_cls
        from digenrl.runtime.loop import WorkerLostError
        from digenrl.runtime.waits import WaitTimeout

        lost, late = (WorkerLostError,), (WaitTimeout, ClusterRefused)

    print(f"digenrl train: model={cfg.model.name} mode={cfg.run.mode} steps={cfg.train.steps} "
          f"samples/step={cfg.data.groups_per_step * cfg.data.group_size} run_dir={cfg.run.run_dir}")
    try:
        summary = trainer_cls(cfg, progress=not args.quiet).train(resume=args.resume)
    except lost as e:  # a lost trainer: the message says how to continue (--resume)
        print(f"digenrl train: {e}", file=sys.stderr)
        return 3
    except late as e:  # a wait past its deadline, one that could never end, a cluster that refused the driver
        why = {"Unplaceable": "refused: ", "ClusterRefused": ""}.get(type(e).__name__, "gave up waiting: ")
        print(f"digenrl train: {why}{e}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:  # Ctrl-C: where the run stands and how to continue, no traceback
        return _interrupted(Path(cfg.run.run_dir), args.argv)
    if "modelled_s" in summary:  # runtime.compute=emulated: no model, no rewards
        print(f"\n== emulated run ==\nmodelled time: {summary['modelled_s']:.1f} s for {summary['steps']} steps")
        print(f"trace: {summary.get('trace')}  gantt: {summary.get('gantt')}")
        return 0
    before, after = summary["eval_reward_before"], summary["eval_reward_after"]
    print("\n== summary ==")
    if before is not None and after is not None:
        print(f"held-out eval reward: {before:.4f} (base) -> {after:.4f} after {summary['steps']} steps "
              f"({after - before:+.4f})")
    if summary.get("plan"):
        print(f"plan:      {summary['plan']}")
    print(f"wall time: {summary['wall_s']:.1f} s of RL steps")
    from digenrl.io.recorder import rate_line

    rates = rate_line(summary)
    if rates:
        print(rates)
    print(f"run dir:   {summary['run_dir']}  (metrics.jsonl, tensorboard/, samples/, checkpoints/)")
    print(f"policy:    {summary['final_policy']}")
    print(f"plot:      {summary['reward_plot']}")
    return 0


def _interrupted(run_dir: Path, argv: Optional[list[str]]) -> int:
    """Say which checkpoint a --resume would continue from, and the command; exit code 130
    (128 + SIGINT, what a shell reports for a Ctrl-C'd program)."""
    from digenrl.io.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run_dir, verify=False)  # quick on Ctrl-C; --resume verifies it
    if latest is None:
        where = f"no checkpoint in {run_dir} yet: --resume starts again from step 0"
    else:  # step_000040 -> 40: the RL steps done (and the policy version) when it was saved
        where = f"latest checkpoint: step {int(latest.name.split('_')[1])} ({latest})"
    if argv is None:
        command = "the same digenrl train command with --resume"
    else:
        command = shlex.join(["digenrl", "train", *argv, *([] if "--resume" in argv else ["--resume"])])
    print(f"\ndigenrl train: interrupted; {where}\nresume with:\n  {command}", file=sys.stderr)
    return 130


def _pretrain_toy(args: argparse.Namespace) -> int:
    from digenrl.models.tiny_dit_weights import ASSET, save_tiny_dit
    from digenrl.toy.pretrain import PRETRAIN_STEPS, PRETRAIN_THREADS, pretrain

    model = pretrain(steps=args.steps or PRETRAIN_STEPS, seed=args.seed, threads=args.threads or PRETRAIN_THREADS)
    out = Path(args.out) if args.out else ASSET
    save_tiny_dit(model, out)
    print(f"saved {out}")
    return 0


def _reward_server(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    try:
        from digenrl.runtime.serving.reward_server import serve_forever
    except ImportError as e:  # ray without its serve extra
        print(f"digenrl reward-server needs Ray Serve ({e}); pip install 'digenrl[serve]'", file=sys.stderr)
        return 2
    try:
        serve_forever(args.reward, args.address, **asdict(serve_options(args)))
    except (ValueError, RuntimeError) as e:  # a bad option, replicas the cluster cannot hold, Serve
        # listening elsewhere, a reward whose replicas could not build it (with their traceback)
        print(f"digenrl reward-server: {e}", file=sys.stderr)
        return 2
    return 0


class _RefuseToken(argparse.Action):
    """`--token`: refused without echoing its value (a process's arguments are readable by every
    user of its machine, and its shell history keeps them)."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("the token is never a command-line argument: set DIGENRL_REWARD_TOKEN in the environment, "
                     "or pass --token-file PATH (or set DIGENRL_REWARD_TOKEN_FILE=PATH)")


def serve_options(args: argparse.Namespace):
    """The `ServeOptions` that `digenrl reward-server`'s flags name (one flag per field)."""
    from dataclasses import fields

    from digenrl.runtime.serving.options import ServeOptions

    return ServeOptions(**{f.name: getattr(args, f.name) for f in fields(ServeOptions)})


def _prompts_list(args: argparse.Namespace) -> int:
    from digenrl.prompt_sets import PROMPT_SETS, cache_path

    for s in PROMPT_SETS.values():
        print(f"{s.name}: {s.description}")
        for split in s.splits:
            state = "cached" if cache_path(s, split).exists() else "not fetched"
            print(f"  {s.name}:{split:<5}  {state:<11}  {cache_path(s, split)}")
        print(f"  source:  {s.source}\n  license: {s.license}; prompts: {s.upstream_license}")
        if s.note:
            print(f"  note:    {s.note}")
    return 0


def _prompts_fetch(args: argparse.Namespace) -> int:
    from digenrl.prompt_sets import PromptSetError, fetch

    try:
        paths = fetch(args.name, args.split, progress=True)
    except PromptSetError as e:
        print(f"digenrl prompts fetch: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"{path}  (digests match the registry)")
    return 0


def _scale(args: argparse.Namespace) -> int:
    """Validate a scale request against the running driver's pools.json, then queue it."""
    from digenrl.runtime import scale

    try:
        req = scale.parse_request(args.request, allow_empty=args.allow_empty)
        state = scale.read_state(Path(args.run_dir))
        queued = [q for _, q in scale.pending(Path(args.run_dir))]
        now, after = scale.check_request(req, state, queued)
    except scale.ScaleError as e:
        print(f"digenrl scale: refused: {e}", file=sys.stderr)
        return 2
    path = scale.write_request(Path(args.run_dir), req)
    what = {"+": f"adding {req.n}", "-": f"draining {req.n}", "=": f"setting the pool to {req.n}"}[req.op]
    print(f"digenrl scale: requested {req} for the run in {args.run_dir} (pid {state.get('pid')}): "
          f"{what}; {req.role} workers {now} -> {after}"
          f"{f' after {len(queued)} queued request(s)' if queued else ''}; request {path.name}, "
          f"answered in {Path(args.run_dir) / scale.LOG}")
    return 0


def _trace(args: argparse.Namespace) -> int:
    """trace.json and gantt.png from a Ray run's trace.jsonl, while it runs or after it stopped."""
    from digenrl.io.trace import build_outputs

    log = Path(args.run_dir) / "trace.jsonl"
    steps = None
    if args.steps is not None:
        try:
            a, b = (int(x) for x in args.steps.split(":"))
        except ValueError:
            print(f"digenrl trace: --steps {args.steps!r}: want A:B, RL steps A to B-1", file=sys.stderr)
            return 2
        steps = (a, b)
    if not log.is_file():
        print(f"digenrl trace: no {log} (Ray runs write it; run.mode=local has no trace)", file=sys.stderr)
        return 2
    out = build_outputs(log, args.out or args.run_dir, steps)
    print(f"trace: {out['trace']}  gantt: {out['gantt']}")
    return 0


TRAIN_HELP = "RL post-training (GRPO) of a flow-matching generator"


class _HelpConfig(argparse.Action):
    """--help-config: print every config key (type, default, description) and exit, as --help does."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from digenrl.config.keys import config_help

        print(config_help(), end="")
        parser.exit()


def _add_train_arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("--help-config", action=_HelpConfig,
                   help="print every config key with its type, default and description, and exit")
    t.add_argument("--config", help="YAML config (see recipes/)")
    t.add_argument("--steps", type=int, help="RL steps (train.steps)")
    t.add_argument("--seed", type=int, help="run.seed")
    t.add_argument("--run-dir", help="run.run_dir: where metrics, checkpoints and samples go")
    t.add_argument("--address", help="an existing Ray cluster (runtime.address; default $RAY_ADDRESS or a local one)")
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run dir")
    t.add_argument("--quiet", action="store_true", help="no progress bar or per-step lines")
    t.add_argument("overrides", nargs="*", help="key=value config overrides, anywhere among the options, "
                                                "e.g. train.lr=3e-4")
    t.set_defaults(func=_train, argv=None)  # main() sets argv: the words after 'train'


def train_parser() -> argparse.ArgumentParser:
    """`digenrl train` on its own, so its key=value overrides may sit between options:
    argparse's intermixed parsing refuses a parser with subcommands, not this one."""
    t = argparse.ArgumentParser(prog="digenrl train", description=TRAIN_HELP)
    _add_train_arguments(t)
    return t


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="digenrl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    _add_train_arguments(sub.add_parser("train", help=TRAIN_HELP))

    p = sub.add_parser("pretrain-toy", help="rebuild the toy world's base generator")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default 1: reproduces the shipped file bit for bit)")
    p.add_argument("--out", help="output .safetensors (default: the shipped asset)")
    p.set_defaults(func=_pretrain_toy)

    r = sub.add_parser("reward-server", help="serve a reward model over HTTP on Ray Serve (safetensors in, JSON out)")
    r.add_argument("reward", help="e.g. 'pickscore?path=/models/PickScore_v1&device=cuda' or module.path:Factory")
    r.add_argument("--host", default="127.0.0.1",
                   help="0.0.0.0 to serve other machines (then a token is required: $DIGENRL_REWARD_TOKEN or --token-file)")
    r.add_argument("--port", type=int, default=8000, help="0: a free port (or that of the Serve already running)")
    r.add_argument("--ingress", default="replica",
                   help="who listens for HTTP: each replica itself (fast; each node serves its own replicas) "
                        "or Serve's HTTP proxy (balances over nodes, 5-8x the CPU per request)")
    r.add_argument("--address", help="an existing Ray cluster ('auto', host:port; default $RAY_ADDRESS or a new local one)")
    r.add_argument("--replicas", type=int, default=0,
                   help="deployment replicas, each a process with its own copy of the reward (0: one per CPU "
                        "of this machine, at most 4, as many as the cluster holds)")
    r.add_argument("--reward-on", default="auto",
                   help="where a replica calls the reward: its event loop ('loop'), or a thread beside it "
                        "('thread'); 'auto': a thread when the replica has GPUs, else the loop")
    r.add_argument("--max-batch", type=int, default=64, help="samples per reward call (and per batch)")
    r.add_argument("--batch-wait-s", type=float, default=0.01, help="how long a batch waits for more requests")
    r.add_argument("--max-request-mb", type=float, default=256.0, help="bodies over this get a 413")
    r.add_argument("--timeout-s", type=float, default=120.0, help="requests not scored within this get a 504")
    r.add_argument("--read-timeout-s", type=float, default=60.0, help="bodies not received within this get a 408")
    r.add_argument("--max-ongoing", type=int, default=128, help="requests one replica holds at once")
    r.add_argument("--max-queued", type=int, default=256,
                   help="requests waiting beyond --max-ongoing before a 503 (-1: no limit)")
    r.add_argument("--cpus-per-replica", type=float, default=1.0)
    r.add_argument("--gpus-per-replica", type=float, default=0.0, help="e.g. 1 for a reward on device=cuda")
    r.add_argument("--shutdown-grace-s", type=float, default=3.0,
                   help="after Ctrl-C, how long requests in flight may still run")
    r.add_argument("--token-file", help="a file holding the bearer token every request must carry (default: "
                                        "$DIGENRL_REWARD_TOKEN, else the file $DIGENRL_REWARD_TOKEN_FILE names; "
                                        "the token itself is never an argument)")
    r.add_argument("--token", nargs="?", action=_RefuseToken, help=argparse.SUPPRESS)  # not --token-file abbreviated
    r.add_argument("--tls-cert", help="PEM certificate file: serve HTTPS (with --tls-key)")
    r.add_argument("--tls-key", help="PEM private key file of --tls-cert")
    r.set_defaults(func=_reward_server)

    ps = sub.add_parser("prompts", help="named prompt sets (pickscore, ocr, geneval, drawbench): list, fetch")
    pss = ps.add_subparsers(dest="prompts_command", required=True)
    pss.add_parser("list", help="the sets, their splits, cache paths, sources and licenses"
                   ).set_defaults(func=_prompts_list)
    pf = pss.add_parser("fetch", help="download a set into the cache ($DIGENRL_CACHE) and check its digests")
    pf.add_argument("name", help="a set name, see 'digenrl prompts list'")
    pf.add_argument("--split", choices=("train", "test"), help="one split (default: every split the set has)")
    pf.set_defaults(func=_prompts_fetch)

    sc = sub.add_parser("scale", help="grow or drain a running run's rollout pool (rollout=+N, -N or N)")
    sc.add_argument("--run-dir", required=True, help="the run directory of a running `digenrl train` (Ray mode)")
    sc.add_argument("request", help="rollout=+N adds N rollout workers, rollout=-N drains N (each "
                                    "finishes or hands over its trajectory), rollout=N sets the pool to N")
    sc.add_argument("--allow-empty", action="store_true",
                    help="TAG modes only: may drain the last rollout worker (trainers generate)")
    sc.set_defaults(func=_scale)

    tr = sub.add_parser("trace", help="trace.json (Perfetto) and gantt.png from a Ray run's trace.jsonl")
    tr.add_argument("--run-dir", required=True, help="a Ray run's directory (running or stopped)")
    tr.add_argument("--steps", help="A:B: only RL steps A to B-1 (default: trace.json every step, "
                                    "gantt.png the last 100)")
    tr.add_argument("--out", help="where to write them (default: the run directory)")
    tr.set_defaults(func=_trace)

    for name, _, _, text in DELEGATED:  # listed for --help; main() hands them their argv
        sub.add_parser(name, help=text)
    return parser


# (subcommand, module, function(argv) -> exit code, help)
DELEGATED = [
    ("simulate", "digenrl.sim.cli", "simulate_main", "simulate every mode on a testbed on a virtual clock"),
    ("plan", "digenrl.sim.cli", "plan_main", "choose the rollout/trainer split and knobs for a testbed"),
    ("bench", "digenrl.tools.bench", "bench_main", "run every mode side by side (--real tiny model or --emulated)"),
    ("profile", "digenrl.profile", "profile_main", "measure per-step costs on this machine (calibration JSONL)"),
    ("sample", "digenrl.tools.posthoc", "sample_main", "images of a run's saved weights (ODE, fixed noise), with a grid"),
    ("eval", "digenrl.tools.posthoc", "eval_main", "base vs trained weights per reward, paired on the same noise"),
]


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    for name, module, function, _ in DELEGATED:  # their own parsers take every argument
        if argv[:1] == [name]:
            import importlib

            return getattr(importlib.import_module(module), function)(argv[1:])
    if argv[:1] == ["train"]:
        args = train_parser().parse_intermixed_args(argv[1:])
        args.argv = argv[1:]  # the user's own words, for the resume command after a Ctrl-C
    else:
        args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
