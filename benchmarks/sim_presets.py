"""The paper-preset table: every packaged testbed, every mode, side by side.

    python benchmarks/sim_presets.py [--out results/sim] [--steps 12] [--presets a,b] [--no-published]
    python benchmarks/sim_presets.py --sp [--presets a,b] [--sp-groups 1,2,4,8]

Prints the shipped rows against the peers' published step times (sim/published.py), then one
table per preset (see docs/guides/planning.md for the columns: the shipped rows, colocated-ideal and the
ladder, every speedup decomposed), then a markdown summary, and writes
report-<preset>.json, gantt-<preset>-<mode>.png and summary.json into --out.
--sp prints, for the presets whose model has Ulysses attention (sim.sp), digenrl's plan with
sequence-parallel gangs against its best plan without them (utilisation of the ideal bound and
the gain), optionally at several prompts per step (--sp-groups).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from digenrl.sim.simulate import simulate
from digenrl.sim.testbed import list_presets


def trainer_memory(tb, knobs: dict) -> dict:
    """GiB one trainer GPU holds under the plan's gang and reshard (memory.memory_gib, FitReport)."""
    from digenrl.sim.costs import default_cost_model

    gang, after_step = knobs.get("gang") or 1, knobs.get("reshard") == "after-step"
    sp = knobs.get("trainer_sp") or 1
    dev = (tb.pool("trainer") or tb.pools)[0].device
    rep = default_cost_model().fits(tb.model, ["trainer"], dev, train_batch=tb.micro_batch, lora=tb.lora,
                                    grad_ckpt=tb.grad_ckpt, cfg=tb.train_cfg, shape=tb.shape,
                                    lora_rank=tb.lora_rank, fsdp_shards=gang, gang=gang > 1,
                                    after_step=after_step, sp=sp, offload=bool(knobs.get("offload")))
    m = rep.roles["trainer"]
    return {"weights": m.weights, "grads": m.grads, "optimizer": m.optimizer, "activations": m.activations,
            "peak": rep.peak_gib, "usable": rep.usable_gib}


def memory_rows() -> list[str]:
    """Markdown rows: each preset's smallest fitting gang (half the split pool, or the fixed trainer
    pool) and its trainer GPU memory, for reshard after-forward and after-step (memory.py)."""
    from digenrl.sim.testbed import load_testbed
    from digenrl.sim.workload import trainer_fit

    rows = []
    for name in list_presets():
        tb = load_testbed(name)
        split = tb.split_pool
        trainers = tb.n_gpus // 2 if split else sum(p.count for p in tb.pool("trainer"))
        cells = []
        for after_step in (False, True):
            gang, rep = trainer_fit(tb, trainers, after_step=after_step)
            m = rep.roles["trainer"]
            cells.append(f"{gang} | {m.weights:.1f} / {m.grads:.1f} / {m.optimizer:.1f} / {m.activations:.1f} | "
                         f"{rep.peak_gib:.1f}")
        rows.append(f"| {name} | {tb.model} {'LoRA' if tb.lora else 'full'} | {trainers} | " + " | ".join(cells) + " |")
    return rows


def sp_rows(names: list[str], groups: list[int] | None, steps: int) -> list[str]:
    """Markdown rows: digenrl's plan with sequence-parallel gangs and without (the degrees fixed
    at 1), each preset at its own prompts per step or at each of `groups`."""
    import dataclasses

    from digenrl.sim.planner import plan
    from digenrl.sim.report import ideal_step_s
    from digenrl.sim.sp import CATALOGUE
    from digenrl.sim.testbed import load_testbed

    rows = ["| preset | prompts x samples | ideal s/step | with SP: s/step, util, plan | without SP: s/step, util, plan "
            "| gain |", "|---|---|---|---|---|---|"]
    for name in names:
        base = load_testbed(name)
        if base.model not in CATALOGUE:
            continue
        for g in groups or [base.groups_per_step]:
            tb = dataclasses.replace(base, groups_per_step=g)
            ideal = ideal_step_s(tb)["step_s"]
            t0 = time.perf_counter()
            with_sp = plan(tb, steps=steps)
            without = plan(dataclasses.replace(tb, rollout_gang=1, trainer_sp=1), steps=steps)

            def cell(pl) -> str:
                k = pl.spec.knobs()
                return (f"{pl.step_s:.1f}, {100 * ideal / pl.step_s:.1f}%, rollout {k.get('n_rollout')} GPUs in gangs "
                        f"of {k.get('rollout_gang') or 1}, trainer gang {k.get('gang')} sp {k.get('trainer_sp') or 1}")
            rows.append(f"| {name} | {g} x {tb.group_size} | {ideal:.1f} | {cell(with_sp)} | {cell(without)} | "
                        f"{without.step_s / with_sp.step_s:.3f}x |")
            print(rows[-1] + f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/sim")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--presets", help="comma-separated preset names (default: all but the small test preset)")
    p.add_argument("--memory", action="store_true", help="print the memory table (markdown) and exit")
    p.add_argument("--sp", action="store_true", help="print the sequence-parallel table (markdown) and exit")
    p.add_argument("--sp-groups", help="with --sp: comma-separated prompts per step to plan each preset at")
    p.add_argument("--no-published", dest="published", action="store_false",
                   help="skip the published-figures table printed first")
    a = p.parse_args(argv)
    if a.memory:
        print("\n".join(memory_rows()))
        return 0
    if a.sp:
        names = a.presets.split(",") if a.presets else list_presets()
        groups = [int(g) for g in a.sp_groups.split(",")] if a.sp_groups else None
        print("\n".join(sp_rows(names, groups, a.steps)))
        return 0
    if a.published:
        from digenrl.sim.published import FIGURES, predict, table

        print("== the shipped rows against the step times the peers publish (sim/published.py)")
        print(table([predict(f) for f in FIGURES]) + "\n", flush=True)
    names = a.presets.split(",") if a.presets else [n for n in list_presets() if not n.startswith("small")]
    summary = {}
    for name in names:
        t0 = time.perf_counter()
        rep = simulate(name, steps=a.steps, out_dir=a.out)
        print(rep.table())
        print(f"({time.perf_counter() - t0:.1f} s)\n", flush=True)
        d = rep.to_dict()
        knobs = d["plans"]["digenrl"]["knobs"]
        knobs["mode"] = d["plans"]["digenrl"]["mode"]  # colocated when digenrl's best plan is the plain colocated one
        summary[name] = {
            "digenrl_utilisation": d["rows"]["digenrl"]["utilisation"],
            "speedups": {b: x["total"] for b, x in d["decomposition"].items()},
            "factors": {b: x["factors"] for b, x in d["decomposition"].items()},
            "digenrl_plan": knobs,
            "trainer_memory_gib": trainer_memory(rep.testbed, knobs),
        }
    print("== summary: digenrl utilisation of the ideal bound, speedups (a x b x c x r), plan")
    bases = list(next(iter(summary.values()))["speedups"]) if summary else []
    print("| preset | digenrl util | " + " | ".join(f"vs {b}" for b in bases) + " | digenrl plan |")
    print("|---" * (len(bases) + 3) + "|")
    for name, s in summary.items():
        k = s["digenrl_plan"]
        cells = []
        for b in bases:
            f = s["factors"][b]
            cells.append(f"{s['speedups'][b]:.2f}x = {f['baseline_costs']:.2f} x {f['heterogeneity']:.2f} x "
                         f"{f['independent_scaling']:.2f} x {f['overlap']:.2f}")
        where = (f"run.mode=colocated, {k.get('memory') or 'cheapest layout'}" if k["mode"] == "colocated" else
                 f"gang {k.get('gang')} {k.get('reshard')}, rollout {k.get('n_rollout', 'fixed')}"
                 + (", offload" if k.get("offload") else ""))
        print(f"| {name} | {100 * s['digenrl_utilisation']:.1f}% | " + " | ".join(cells) +
              f" | {where}"
              + (f", rollout gang {k['rollout_gang']}" if (k.get("rollout_gang") or 1) > 1 else "")
              + (f", trainer sp {k['trainer_sp']}" if (k.get("trainer_sp") or 1) > 1 else "") + " |")
    print("== headline: digenrl's utilisation and its speedup over each colocated row (README)")
    heads = ("verl-omni", "genrl", "flow_grpo", "colocated-ideal")
    print("| preset | digenrl util | " + " | ".join(f"vs {b}{' (shipped)' if b != 'colocated-ideal' else ''}"
                                                  for b in heads) + " |")
    print("|---" * (len(heads) + 2) + "|")
    for name, s in summary.items():
        per = lambda b: " per $" if name.startswith("hetero") else ""  # noqa: E731
        print(f"| {name} | {100 * s['digenrl_utilisation']:.1f}% | " + " | ".join(
            f"{s['speedups'][b]:.2f}x{per(b)}" if b in s["speedups"] else "does not fit" for b in heads) + " |")
    print("== memory per trainer GPU of digenrl's plan (GiB; memory.py)")
    for name, s in summary.items():
        m = s["trainer_memory_gib"]
        # run.mode=colocated: every GPU a replicated gang of 1 (baselines.RUNTIME_LAYOUT); its
        # trainer state is this, beside the sampler's and reward model's (the colocated memory rule)
        where = "run.mode=colocated, replicated: " if s["digenrl_plan"]["mode"] == "colocated" else ""
        print(f"{name:<32} {where}" + "  ".join(f"{k} {v:.1f}" for k, v in m.items()))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
