"""`digenrl simulate` and `digenrl plan` (wired into digenrl/tools/cli.py by the lead).

    digenrl simulate --testbed FILE|PRESET [--steps N] [--modes a,b] [--json OUT] [--out DIR]
                     [--seed N] [runtime.rollout.preemptions=TRACE.jsonl]
    digenrl plan --testbed FILE|PRESET --gpus N [--mode digenrl] [--exhaustive] [--out plan.yaml]
    digenrl plan --testbed FILE|PRESET --spot [--seeds N] [--interruptions-per-hour R]

`plan` prints the chosen knobs as the config keys that hold them and writes a config YAML
(--out) that `digenrl train --config plan.yaml` runs as it is: emulated compute on the
testbed's cost model; `runtime.compute=real model.path=...` runs it for real (with
runtime.weight_sync object-store or lora-only until the collective weight path lands).

Testbed names resolve to the packaged presets (digenrl/sim/testbeds/*.yaml); a path ending
in .yaml is read as your own testbed (see docs/guides/planning.md). Unknown names list the presets.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from digenrl.sched import GAP_MODES
from digenrl.sim.testbed import TestbedError, load_testbed

EMULATED_RUN_S = 60.0  # wall seconds the written config's emulated run should take
TCSS_OFFER = 0.5  # the stale share `plan` prices beside an on-policy plan (the RFC's curve offers 0.5)
PREEMPTIONS_KEY = "runtime.rollout.preemptions"  # the emulated runtime's key for a preemption trace


def _testbed(name: str, prog: str):
    try:
        return load_testbed(name)
    except (TestbedError, FileNotFoundError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None


def _freeze_heap() -> None:
    """What the process holds after its imports (torch, the configs) out of the cyclic
    garbage collector's reach: a planner search allocates millions of short-lived objects,
    and every full collection walked all of those too (~7% of a digenrl simulate). Commands
    are short-lived processes; nothing imported is garbage."""
    import gc

    gc.collect()
    gc.freeze()


def simulate_main(argv=None) -> int:
    from digenrl.sim.planner import PLAN_STEPS, jobs
    from digenrl.sim.simulate import ALL, simulate

    _freeze_heap()

    p = argparse.ArgumentParser(prog="digenrl simulate",
                                description="Every scheduling mode side by side on a simulated cluster.")
    p.add_argument("--testbed", required=True, help="preset name or testbed YAML path")
    p.add_argument("--steps", type=int, default=PLAN_STEPS, help="RL steps simulated per mode (>= 3)")
    p.add_argument("--modes", default=",".join(ALL), help=f"comma-separated, from: {','.join(ALL)}")
    p.add_argument("--json", help="write the report as JSON to this file")
    p.add_argument("--out", help="directory for report JSON and one Gantt PNG per mode")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes the planner runs a search line's points on (default: one per core); "
                        "the plan and every figure are the same for any value")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the spot pools' preemption process (default: the run's run.seed)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help=f"{PREEMPTIONS_KEY}=TRACE.jsonl: run the digenrl row again under this preemption trace "
                        "(sched.preemption's JSON lines, the file the emulated runtime reads)")
    a = p.parse_args(argv)
    tb = _testbed(a.testbed, p.prog)
    if tb is None:
        return 2
    trace_path = None
    for kv in a.overrides:
        key, eq, value = kv.partition("=")
        if key != PREEMPTIONS_KEY or not eq or not value:
            print(f"{p.prog}: unknown override {key!r}; allowed: {PREEMPTIONS_KEY}=PATH", file=sys.stderr)
            return 2
        trace_path = value
    events = None
    if trace_path is not None:
        from digenrl.sched.preemption import read_trace

        try:
            events = read_trace(trace_path)
        except (OSError, ValueError) as e:
            print(f"{p.prog}: {PREEMPTIONS_KEY}: {e}", file=sys.stderr)
            return 2
    from digenrl.sim.simulate import NOT_A_ROW

    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in ALL]
    if bad:
        print(f"{p.prog}: unknown modes {bad}; allowed: {list(ALL)}"
              + (f" ({NOT_A_ROW})" if "colocated" in bad else ""), file=sys.stderr)
        return 2
    if a.steps < 3:
        print(f"{p.prog}: --steps must be >= 3 (one fill, one measured, one drain step)", file=sys.stderr)
        return 2
    if a.jobs is not None and a.jobs < 1:
        print(f"{p.prog}: --jobs must be >= 1", file=sys.stderr)
        return 2
    try:
        with jobs(a.jobs):
            rep = simulate(tb, modes, a.steps, out_dir=a.out)
    except ValueError as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    print(rep.table())
    spot = None
    if events is not None or any(pool.spot is not None for pool in tb.pools):
        if "digenrl" not in rep.rows:
            print(f"{p.prog}: preemptions run the digenrl row; add it to --modes", file=sys.stderr)
            return 2
        from digenrl.sim.spot import run_spot, spot_line

        try:
            spot = run_spot(tb, rep.rows["digenrl"].spec, max(a.steps, 3), seed=a.seed, events=events)
        except ValueError as e:
            print(f"{p.prog}: {e}", file=sys.stderr)
            return 2
        print(spot_line(spot, trace_path))
    if a.json:
        d = rep.to_dict()
        if spot is not None:
            from digenrl.sim.spot import spot_dict

            d["spot"] = spot_dict(spot)
        with open(a.json, "w") as f:
            json.dump(d, f, indent=1)
    return 0


# Single changes `plan` tries when no plan fits, smallest first: each maps a testbed to the changed one
# (None: does not apply). A change "makes one fit" when DigenRL's most memory-frugal plan holds the
# training state (workload.refusal with memory=True: one gang over every GPU, AdamW state on the host).
CHANGES = [
    ("micro_batch: 1", lambda tb: replace(tb, micro_batch=1) if tb.micro_batch > 1 else None),
    ("grad_ckpt: true", lambda tb: replace(tb, grad_ckpt=True) if not tb.grad_ckpt else None),
    ("lora: true", lambda tb: replace(tb, lora=True, weight_sync="lora-only") if not tb.lora else None),
    ("--gpus x2", lambda tb: _more_gpus(tb, 2)),
    ("--gpus x4", lambda tb: _more_gpus(tb, 4)),
    ("device: H200", lambda tb: _device(tb, "H200")),
    ("device: B200", lambda tb: _device(tb, "B200")),
]


def _more_gpus(tb, k: int):
    from digenrl.sim.testbed import resize

    return resize(tb, tb.n_gpus * k) if len(tb.pools) == 1 and tb.pools[0].role == "any" else None


def _device(tb, device: str):
    if all(p.device == device for p in tb.pools):
        return None
    return replace(tb, pools=tuple(replace(p, device=device) if p.role in ("any", "trainer") else p for p in tb.pools))


def smallest_change(tb, gpus=None) -> str | None:
    """The first of CHANGES after which some DigenRL plan fits on `tb` (resized to `gpus`)."""
    from digenrl.sim.testbed import TestbedError, resize
    from digenrl.sim.workload import refusal

    tb = resize(tb, gpus)
    for what, change in CHANGES:
        try:
            new = change(tb)
            if new is not None and refusal(new, memory=True) is None:
                return what
        except (TestbedError, ValueError):
            continue
    return None


def plan_main(argv=None) -> int:
    from digenrl.sim.planner import PLAN_STEPS, exhaustive, jobs, plan
    from digenrl.sim.simulate import ROWS

    _freeze_heap()

    p = argparse.ArgumentParser(prog="digenrl plan",
                                description="Pool split, micro-batch, TSP chunk and TAG segment for best throughput.")
    p.add_argument("--testbed", required=True, help="preset name or testbed YAML path")
    p.add_argument("--gpus", type=int, help="resize the testbed's split pool to N GPUs (whole nodes)")
    p.add_argument("--mode", default="digenrl",
                   help=f"a row, one of: {','.join(ROWS)}; or a run.mode digenrl train accepts (colocated: "
                        "the runtime's colocated mode, every GPU a replicated gang of 1)")
    p.add_argument("--exhaustive", action="store_true", help="also brute-force the same grid and compare")
    p.add_argument("--steps", type=int, default=None, help="train.steps written into the config (default 12)")
    p.add_argument("--out", help="write the planned run as a config YAML for `digenrl train --config`")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes the planner runs a search line's points on (default: one per core); "
                        "the plan and every figure are the same for any value")
    p.add_argument("--spot", action="store_true",
                   help="price the rollout pool by size (whole nodes) and mix (on demand, by whole nodes on spot, all "
                        "spot): throughput, USD per 1,000 samples, expected lost work (the pool's spot: terms or "
                        "its device's estimates); --steps: RL steps simulated per run (default 24)")
    p.add_argument("--seeds", type=int, default=8, help="--spot: preemption draws averaged per mix")
    p.add_argument("--interruptions-per-hour", type=float, default=None,
                   help="--spot: replace the spot rate (per worker and hour) for a what-if")
    a = p.parse_args(argv)
    tb = _testbed(a.testbed, p.prog)
    if tb is None:
        return 2
    if a.spot:
        return _plan_spot(p.prog, tb, a)
    if a.seeds != 8 or a.interruptions_per_hour is not None:
        print(f"{p.prog}: --seeds and --interruptions-per-hour go with --spot", file=sys.stderr)
        return 2
    from digenrl.sim.simulate import digenrl_plan, mode_and_style

    try:
        mode, style = mode_and_style(a.mode)
    except ValueError as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    if a.out and style is not None:
        print(f"{p.prog}: --out: the {a.mode} row is not a run digenrl train makes ("
              + ("a bound over every colocated memory plan, which no config key selects"
                 if a.mode == "colocated-ideal" else "a peer as it ships")
              + "); --mode colocated plans the runtime's colocated mode", file=sys.stderr)
        return 2
    if a.jobs is not None and a.jobs < 1:
        print(f"{p.prog}: --jobs must be >= 1", file=sys.stderr)
        return 2
    try:
        with jobs(a.jobs):
            pl = digenrl_plan(tb, a.gpus) if a.mode == "digenrl" else plan(tb, a.gpus, mode, style=style)
    except ValueError as e:
        print(f"{p.prog}: no {a.mode} plan fits: {e}", file=sys.stderr)
        change = smallest_change(tb, a.gpus)
        print(f"{p.prog}: smallest change that makes one fit: {change}" if change else
              f"{p.prog}: no single change tried makes one fit ({', '.join(k for k, _ in CHANGES)})",
              file=sys.stderr)
        return 2
    from digenrl.config.errors import ConfigError
    from digenrl.config.schema import dump_config
    from digenrl.sim.testbed import resize
    from digenrl.sim.workload import config_for

    where = resize(tb, a.gpus)
    knobs = " ".join(f"{k}={v}" for k, v in pl.spec.overrides(where).items())
    print(f"plan {pl.testbed} ({pl.gpus} GPUs) mode={a.mode}: {knobs}")
    if style is not None:  # a row no config runs: say what was simulated
        what = (f"memory plan {pl.spec.memory or 'the cheapest that fits'}" if a.mode == "colocated-ideal"
                else "the peer as it ships")
        print(f"  simulated: {what} (a row, not a config: run.mode=colocated runs every GPU replicated)")
    print(f"  {pl.step_s:.2f} s/step, {pl.throughput:.3f} samples/s; {pl.evaluated} of {pl.grid_size} grid "
          f"points simulated in {pl.wall_s:.1f} s (analytic split: {pl.analytic_n_rollout})")
    if pl.spec.mode in GAP_MODES and not pl.spec.tcss_fraction:  # freshness or throughput, knowingly
        from digenrl.sim.report import run_spec

        try:
            stale = run_spec(where, replace(pl.spec, tcss_fraction=TCSS_OFFER), a.steps or PLAN_STEPS)
            print(f"  with TCSS (run.tcss_fraction={TCSS_OFFER}: up to that share of a step generated one "
                  f"version stale): {stale.step_s:.2f} s/step, {stale.throughput:.3f} samples/s "
                  f"({pl.step_s / stale.step_s:.3f}x); the plan above stays on policy")
        except ValueError as e:
            print(f"  with TCSS (run.tcss_fraction={TCSS_OFFER}): not simulated ({e})")
    if a.exhaustive:
        ex = exhaustive(tb, a.gpus, mode, style=style)
        print(f"exhaustive: {ex.spec.knobs()}")
        print(f"  {ex.step_s:.2f} s/step, {ex.throughput:.3f} samples/s; {ex.evaluated} points in {ex.wall_s:.1f} s")
        print(f"  planner / exhaustive throughput: {pl.throughput / ex.throughput:.4f}")
    if a.out:
        ref = a.testbed if a.testbed.endswith((".yaml", ".yml")) else None
        try:
            cfg = config_for(where, pl.spec, a.steps or PLAN_STEPS, testbed_ref=ref)
        except (ConfigError, ValueError) as e:
            print(f"{p.prog}: the plan cannot be written as a runnable config: {e}", file=sys.stderr)
            return 2
        # emulated wall time ~ EMULATED_RUN_S: sleeps shrink by time_scale (docs/guides/running.md)
        cfg.runtime.time_scale = round(min(1.0, EMULATED_RUN_S / (pl.step_s * cfg.train.steps)), 4)
        header = (f"# digenrl plan --testbed {a.testbed} --gpus {pl.gpus} --mode {a.mode}\n"
                  f"# simulated: {pl.step_s:.2f} s/step, {pl.throughput:.3f} samples/s\n"
                  "# digenrl train --config THIS_FILE   (emulated compute on the testbed's costs;\n"
                  "#   runtime.compute=real model.path=... reward.paths.<name>=... for the real run)\n"
                  "# runtime.trainer.gang/shard/reshard: the smallest FSDP gang that holds the\n"
                  "#   training state (sim/memory.py) and the reshard policy the planner chose\n"
                  "# runtime.rollout.gang / runtime.trainer.sp: sequence-parallel degrees the planner\n"
                  "#   chose (video models with Ulysses attention, sim/sp.py; absent: 1)\n")
        with open(a.out, "w") as f:
            f.write(header + dump_config(cfg))
        print(f"wrote {a.out}")
    return 0


PREEMPTIBLE = "runtime.rollout.preemptible=true"  # the runtime's mark of a spot rollout pool


def _accepts(keys: list) -> bool:
    """Whether `digenrl train` takes these key=value overrides (config.schema.load_config)."""
    from digenrl.config.errors import ConfigError
    from digenrl.config.schema import load_config

    try:
        load_config(overrides=keys)
    except (ConfigError, ValueError, TypeError):
        return False
    return True


def _plan_spot(prog: str, tb, a) -> int:
    """`digenrl plan --spot`: sim.spot.plan_spot's sizes and mixes as a table, then the cheapest
    per 1,000 samples as the keys and testbed pools that run it."""
    from digenrl.sim.planner import jobs
    from digenrl.sim.spot import SPOT_STEPS, plan_spot, pool_yaml, spot_table

    if a.mode != "digenrl" or a.gpus or a.exhaustive or a.out:
        print(f"{prog}: --spot plans the digenrl mode on the testbed's pools; drop --mode/--gpus/--exhaustive/--out",
              file=sys.stderr)
        return 2
    if (a.jobs is not None and a.jobs < 1) or a.seeds < 1 or (a.interruptions_per_hour is not None and a.interruptions_per_hour < 0):
        print(f"{prog}: --jobs and --seeds must be >= 1, --interruptions-per-hour >= 0", file=sys.stderr)
        return 2
    try:
        with jobs(a.jobs):
            rows = plan_spot(tb, a.steps or SPOT_STEPS, a.seeds, interruptions_per_hour=a.interruptions_per_hour)
    except (TestbedError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(spot_table(tb, rows, a.steps or SPOT_STEPS, a.seeds))
    best = min(rows, key=lambda r: r.usd_per_1k)
    knobs = [f"{k}={v}" for k, v in best.spec.overrides(best.testbed).items()]
    marked = best.spot_gpus == best.rollout_gpus and _accepts(knobs + [PREEMPTIBLE])
    print(f"cheapest per 1,000 samples: {best.label}")
    print(f"  digenrl train keys: {' '.join(knobs + [PREEMPTIBLE] * marked)}")
    if best.spot_gpus and not marked:
        why = ("a mix: the runtime marks the whole rollout pool" if best.spot_gpus < best.rollout_gpus
               else "this digenrl train does not know the key")
        print(f"  ({PREEMPTIBLE} not added: {why}; the testbed pools below say which GPUs are spot)")
    print("  testbed pools (spot: marks the preemptible ones):")
    for pool in best.testbed.pools:
        print(pool_yaml(pool))
    return 0


if __name__ == "__main__":
    raise SystemExit(simulate_main())
