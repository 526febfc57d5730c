"""Config validation: each key acts only where it is documented, or is refused naming itself."""

import pytest

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config

CUDA_RAY = ["model.device=cuda", "run.mode=digenrl"]


def _refused(overrides: list[str], *words: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return str(e.value)


# -- run.mode=local: one process, no Ray ---------------------------------------------------
@pytest.mark.parametrize("overrides, key", [
    (["runtime.plan=always"], "runtime.plan"),
    (["runtime.compute=emulated", "runtime.testbed=h200x16-flux"], "runtime.compute"),
    (["model.name=wan", "model.path=/m", "runtime.rollout.gang=2"], "runtime.rollout.gang"),
    (["model.name=wan", "model.path=/m", "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp",
      "runtime.trainer.sp=2"], "runtime.trainer.sp"),
    (["runtime.network_interface=lo"], "runtime.network_interface"),
    (["runtime.placement_timeout_s=5"], "runtime.placement_timeout_s"),
    (["runtime.start_timeout_s=5"], "runtime.start_timeout_s"),
    (["runtime.stall_timeout_s=5"], "runtime.stall_timeout_s"),
    (["runtime.plan_probe_steps=3"], "runtime.plan_probe_steps"),
])
def test_local_mode_refuses_the_keys_only_a_ray_run_reads(overrides, key):
    _refused(["run.mode=local", *overrides], key, "run.mode=local")
    load_config(None, ["run.mode=digenrl", *overrides])  # the same keys on Ray are fine


def test_the_ray_runtime_and_the_contract_refuse_local_mode_through_the_scheduler():
    from digenrl.config.contract import contract
    from digenrl.runtime.driver import RayDriver

    cfg = load_config(None, ["run.mode=local"])
    for build in (contract, RayDriver):
        with pytest.raises(ValueError, match="local.*scheduler"):
            build(cfg)


# -- run.threads vs runtime.worker_threads ------------------------------------------------
@pytest.mark.parametrize("mode", ["digenrl", "colocated", "disagg-sync"])
def test_run_threads_is_refused_on_ray(mode):
    _refused([f"run.mode={mode}", "run.threads=4"], "run.threads", "runtime.worker_threads", mode)


def test_run_threads_is_local_and_worker_threads_is_ray():
    assert load_config(None, ["run.mode=local", "run.threads=4"]).run.threads == 4
    cfg = load_config(None, ["run.mode=digenrl", "runtime.worker_threads=3"])
    assert (cfg.run.threads, cfg.runtime.worker_threads) == (0, 3)
    _refused(["run.mode=local", "run.threads=-1"], "run.threads", ">= 0")


# -- model.device cuda on Ray needs GPU pools ---------------------------------------------
@pytest.mark.parametrize("pool", ["rollout", "trainer"])
def test_cuda_on_ray_refuses_a_pool_without_gpus(pool):
    other = "trainer" if pool == "rollout" else "rollout"
    message = _refused(CUDA_RAY + [f"runtime.{other}.num_gpus=1"], f"runtime.{pool}.num_gpus", "model.device=cuda")
    assert f"runtime.{other}.num_gpus" not in message


def test_cuda_pools_with_gpus_and_the_cases_that_need_none():
    cfg = load_config(None, CUDA_RAY + ["runtime.rollout.num_gpus=1", "runtime.trainer.num_gpus=0.5"])
    assert cfg.runtime.trainer.num_gpus == 0.5  # a fraction reserves a (shared) GPU too
    load_config(None, ["model.device=cuda:1", "run.mode=local"])  # no Ray: no pools
    load_config(None, ["model.device=cpu", "run.mode=digenrl"])  # CPU workers
    # colocated starts every policy worker with the trainer pool's options: the rollout pool's are unused
    load_config(None, ["model.device=cuda", "run.mode=colocated", "runtime.trainer.num_gpus=1"])
    _refused(["model.device=cuda", "run.mode=colocated", "runtime.rollout.num_gpus=1"], "runtime.trainer.num_gpus")
    # emulated workers sleep for the cost model's time and load no model
    load_config(None, CUDA_RAY + ["runtime.compute=emulated", "runtime.testbed=h200x16-flux"])


# -- inputs every run needs, checked without touching the filesystem ----------------------
def test_diffusers_family_needs_a_model_path():
    _refused(["model.name=flux"], "model.path", "flux")
    assert load_config(None, ["model.name=flux", "model.path=black-forest-labs/FLUX.1-dev",
                              "data.prompts=p.txt", "reward.weights={pickscore: 1.0}",
                              "reward.paths.pickscore=/m"]).model.path == "black-forest-labs/FLUX.1-dev"


def test_model_rewards_need_a_path_and_remote_a_served_url():
    _refused(["reward.weights={pickscore: 1.0}"], "reward.paths.pickscore")
    _refused(["reward.weights={remote: 1.0}"], "reward.paths.remote", "#<served reward name>")
    _refused(["reward.weights={remote: 1.0}", "reward.paths.remote=http://h:8000"], "reward.paths.remote")
    _refused(["reward.weights={remote: 1.0}", "reward.paths.remote=h:8000#pickscore"], "reward.paths.remote")
    cfg = load_config(None, ["reward.weights={remote: 1.0, toy-geneval: 1.0}",
                             "reward.paths.remote=http://10.0.0.5:8000#pickscore"])
    assert cfg.reward.paths["remote"].endswith("#pickscore")
    load_config(None, ["reward.weights={jpeg-compressibility: 1.0}"])  # programmatic: no path


# -- the peers' sampling settings: sampling.sigmas, model.max_sequence_length, model.guidance
FLUX = ["model.name=flux", "model.path=/models/flux"]


def test_peer_sampling_keys_act_where_documented():
    cfg = load_config(None, FLUX + ["sampling.sigmas=diffusers", "model.max_sequence_length=128",
                                    "model.guidance=3.5"])
    assert (cfg.sampling.sigmas, cfg.model.max_sequence_length, cfg.model.guidance) == ("diffusers", 128, 3.5)
    cfg = load_config(None, ["model.name=hunyuan-video", "model.path=/m", "model.guidance=6.018"])
    assert cfg.model.guidance == 6.018
    default = load_config(None)  # defaults: today's grid, the family's text length and guidance
    assert (default.sampling.sigmas, default.model.max_sequence_length, default.model.guidance) == ("digenrl", 0, 0.0)


def test_peer_sampling_keys_are_refused_where_they_cannot_act():
    _refused(["sampling.sigmas=karras"], "sampling.sigmas", "digenrl, diffusers")
    _refused(["sampling.sigmas=diffusers"], "sampling.sigmas", "tiny-dit")
    _refused(FLUX + ["sampling.sigmas=diffusers", "sampling.shift=3.0"], "sampling.shift", "scheduler config")
    _refused(["model.name=wan", "model.path=/m", "sampling.sigmas=diffusers"], "sampling.sigmas", "flow-sde")
    assert load_config(None, ["model.name=wan", "model.path=/m", "sampling.sigmas=diffusers",
                              "sampling.sde=dance-sde"]).sampling.sigmas == "diffusers"
    for family in ("sd3", "wan", "qwen-image"):
        _refused([f"model.name={family}", "model.path=/m", "model.guidance=4.0"], "model.guidance", family,
                 "sampling.cfg_scale")
    _refused(["model.guidance=2.0"], "model.guidance", "tiny-dit")
    _refused(FLUX + ["model.guidance=-1"], "model.guidance", ">= 0")
    _refused(["model.max_sequence_length=128"], "model.max_sequence_length", "tiny-dit")
    _refused(FLUX + ["model.max_sequence_length=-5"], "model.max_sequence_length", ">= 0")


# -- train.loss ---------------------------------------------------------------------------
def test_train_loss_reaches_the_learner_or_is_refused():
    from digenrl.train.trainer import learner_config

    assert load_config(None, []).train.loss == "grpo"
    for sde in ("flow-sde", "dance-sde"):
        cfg = load_config(None, ["train.loss=grpo-guard", f"sampling.sde={sde}"])
        assert learner_config(cfg).loss == "grpo-guard"  # the LearnerConfig the Trainer builds too
    _refused(["train.loss=ppo"], "train.loss", "grpo, grpo-guard")
    # cps scores a surrogate, not a Gaussian log-prob: RatioNorm has no std to normalise by
    _refused(["train.loss=grpo-guard", "sampling.sde=cps"], "train.loss", "sampling.sde=cps")


def test_nft_keys_reach_the_learner_or_are_refused():
    """train.loss=nft, reward.adv_clip (NFT's clip) and sampling.sde=ode act
    (tests/learner/test_nft_learner.py); where they cannot act they are refused."""
    from digenrl.train.trainer import learner_config

    cfg = load_config(None, ["train.loss=nft", "reward.adv_clip=3", "sampling.sde=ode"])
    lc = learner_config(cfg)
    assert (lc.loss, lc.adv_clip) == ("nft", 3.0)
    _refused(["train.loss=nft", "train.clip_range=0.01"], "train.clip_range", "no ratio")
    _refused(["sampling.sde=ode"], "sampling.sde", "no log-probs")
    _refused(["train.loss=grpo-guard", "sampling.sde=ode"], "sampling.sde", "no log-probs")
    _refused(["train.loss=nft", "sampling.sde=ode", "sampling.noise_level=0.3"], "sampling.noise_level", "ode")


# -- AWM (issue 27) --
def test_awm_keys_reach_the_learner_or_are_refused():
    """train.loss=awm and its keys act (tests/learner/test_awm_learner.py); ODE rollouts are
    accepted, every sample draws its own noise levels among all of the grid's; what AWM cannot
    act on (a ratio 1 in value, no rollout log-prob) is refused with the key named."""
    from digenrl.data import PromptSource, load_prompts
    from digenrl.train.trainer import learner_config, plan_step

    awm = ["train.loss=awm", "sampling.sde=ode"]
    cfg = load_config(None, [*awm, "sampling.window_size=3", "sampling.window_draw=sample", "reward.adv_clip=3",
                             "train.awm_adv_max=0.5", "train.awm_weighting=ghuber", "train.awm_ghuber_power=0.5"])
    lc = learner_config(cfg)
    assert (lc.loss, lc.adv_clip, lc.awm_adv_max, lc.awm_weighting, lc.awm_ghuber_power) == (
        "awm", 3.0, 0.5, "ghuber", 0.5)
    plan = plan_step(cfg, PromptSource(load_prompts("toy"), 0, cfg.data.groups_per_step), 0)
    assert plan.spec.draw_levels == 10 and plan.spec.sde_steps == () and plan.trained_steps == [0, 1, 2]
    assert load_config(None, ["train.loss=awm"]).sampling.sde == "flow-sde"  # any sampler serves
    _refused([*awm, "train.clip_range=0.01"], "train.clip_range", "1 in value")
    _refused([*awm, "train.behaviour_logp=recompute"], "train.behaviour_logp", "awm")
    _refused(["train.awm_adv_max=2"], "train.awm_adv_max", "train.loss=awm")
    _refused(["train.awm_weighting=t"], "train.awm_weighting", "train.loss=awm")
    _refused([*awm, "train.awm_weighting=huber"], "train.awm_weighting", "uniform, t, t2, ghuber")
    _refused([*awm, "train.awm_ghuber_power=0.5"], "train.awm_ghuber_power", "ghuber")
    _refused([*awm, "train.awm_adv_max=0"], "train.awm_adv_max", "> 0")
# -- end AWM --


def test_window_draw_reaches_the_plan_or_is_refused():
    """sampling.window_draw=sample turns the step's trained steps into slots that each
    sample maps to its own steps (SampleSpec.draw_levels)."""
    from digenrl.data import PromptSource, load_prompts
    from digenrl.train.trainer import plan_step

    def plan(*over):
        cfg = load_config(None, list(over))
        return plan_step(cfg, PromptSource(load_prompts("toy"), 0, cfg.data.groups_per_step), 0)

    step = plan("sampling.window=fraction", "sampling.window_fraction=0.5")
    sample = plan("sampling.window=fraction", "sampling.window_fraction=0.5", "sampling.window_draw=sample")
    assert len(step.trained_steps) == len(sample.trained_steps) == 4  # round(0.5 * 9)
    assert (step.spec.draw_levels, sample.spec.draw_levels) == (0, 9)  # the 9 SDE steps of 10
    assert sample.trained_steps == [0, 1, 2, 3] and step.trained_steps != [0, 1, 2, 3]
    nft = plan("train.loss=nft", "sampling.sde=ode", "sampling.window=all-but-last", "sampling.window_draw=sample")
    assert nft.spec.draw_levels == 10 and nft.spec.sde_steps == () and len(nft.trained_steps) == 9
    _refused(["sampling.window_draw=each"], "sampling.window_draw", "step, sample")
    _refused(["sampling.window=contiguous", "sampling.window_draw=sample"], "sampling.window_draw", "contiguous")


# -- sequence-parallel gangs: runtime.rollout.gang, runtime.trainer.sp ---------------------
def test_sequence_parallel_keys_are_accepted_for_video_families_or_refused():
    """The runtime acts on them (tests/runtime/test_sequence_parallel_gangs.py); here: where
    they cannot act, they are refused before any work, the key named."""
    wan = ["model.name=wan", "model.path=/m", "run.mode=gap"]
    gang = ["runtime.trainer.gang=2", "runtime.trainer.shard=fsdp"]
    cfg = load_config(None, wan + gang + ["runtime.rollout.gang=2", "runtime.trainer.sp=2"])
    assert (cfg.runtime.rollout.gang, cfg.runtime.trainer.sp) == (2, 2)
    _refused(["run.mode=gap", "runtime.rollout.gang=2"], "runtime.rollout.gang", "wan, hunyuan-video", "tiny-dit")
    _refused(["run.mode=gap", *gang, "runtime.trainer.sp=2"], "runtime.trainer.sp", "wan, hunyuan-video")
    _refused(wan + gang + ["runtime.trainer.sp=3"], "runtime.trainer.sp", "must divide")
    _refused(wan + ["runtime.trainer.sp=2"], "runtime.trainer.sp", "must divide")  # gang 1
    _refused(wan + ["runtime.rollout.sp=2"], "runtime.rollout.sp", "runtime.rollout.gang")
    _refused(wan + ["runtime.reward.gang=2"], "runtime.reward.gang", "one device")
    _refused(["model.name=wan", "model.path=/m", "run.mode=local", "runtime.rollout.gang=2"],
             "runtime.rollout.gang", "run.mode=local")


# -- the driver's deadlines (docs/guides/running.md, "Waits and their deadlines") -----------------------
@pytest.mark.parametrize("key", ["runtime.placement_timeout_s", "runtime.start_timeout_s",
                                 "runtime.stall_timeout_s"])
def test_a_deadline_must_be_positive(key):
    for bad in ("0", "-1"):
        _refused([f"{key}={bad}"], key, "must be > 0")
    assert load_config(None, [f"{key}=0.5"]).runtime.__dict__[key.split(".")[1]] == 0.5


def test_nft_old_policy_keys_reach_the_learner_or_are_refused():
    """train.nft_decay, nft_decay_rate, nft_decay_flat and nft_beta act with train.loss=nft and a
    kept old policy (tests/learner/test_nft_learner.py, tests/runtime/test_equivalence.py); the
    schedule and beta keys are refused, named, where the old policy is not kept."""
    from digenrl.train.trainer import learner_config

    nft = ["train.loss=nft", "sampling.sde=ode"]
    lc = learner_config(load_config(None, [*nft, "train.nft_decay=0.999", "train.nft_decay_rate=0.0075",
                                           "train.nft_decay_flat=75", "train.nft_beta=0.1"]))
    assert (lc.nft_decay, lc.nft_decay_rate, lc.nft_decay_flat, lc.nft_beta) == (0.999, 0.0075, 75, 0.1)
    _refused(["train.nft_decay=0.5"], "train.nft_decay", "train.loss=grpo")
    _refused([*nft, "train.nft_decay=1"], "train.nft_decay", "[0, 1)")
    _refused([*nft, "train.nft_decay_rate=0.01"], "train.nft_decay_rate", "train.nft_decay 0")
    _refused([*nft, "train.nft_decay_flat=10"], "train.nft_decay_flat", "train.nft_decay 0")
    _refused([*nft, "train.nft_beta=0.1"], "train.nft_beta", "does not depend on beta")
    _refused([*nft, "train.nft_decay=0.5", "train.nft_beta=0"], "train.nft_beta", "> 0")
    _refused([*nft, "train.nft_decay=0.5", "run.mode=gap+tsp", "runtime.trainer.workers=2",
              "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp", "runtime.trainer.reshard=after-step"],
             "train.nft_decay", "reshard=after-forward")


# -- spot rollout workers and autoscaling (runtime.rollout.preemptible, max_workers) -------
@pytest.mark.parametrize("overrides, key, why", [
    (["runtime.trainer.preemptible=true"], "runtime.trainer.preemptible", "optimizer state"),
    (["runtime.trainer.max_workers=2"], "runtime.trainer.max_workers", "optimizer state"),
    (["runtime.reward.workers=1", "runtime.reward.preemptible=true"], "runtime.reward.preemptible", "reward pool"),
    (["runtime.rollout.notice_s=10"], "runtime.rollout.notice_s", "preemptible=true"),
    (["runtime.rollout.notices=/tmp/n"], "runtime.rollout.notices", "preemptible=true"),
    (["runtime.rollout.preemptible=true", "runtime.rollout.notice_s=-1"], "runtime.rollout.notice_s", ">= 0"),
    (["runtime.rollout.workers=2", "runtime.rollout.max_workers=1"], "runtime.rollout.max_workers", ">= "),
    (["run.mode=gap+tsp+tag", "runtime.rollout.workers=0", "runtime.rollout.max_workers=2"],
     "runtime.rollout.max_workers", "publishes no weights"),
    (["run.mode=gap+tsp+tag", "runtime.rollout.workers=0", "runtime.rollout.preemptible=true"],
     "runtime.rollout.preemptible", "publishes no weights"),
    (["run.mode=colocated", "runtime.rollout.workers=1", "runtime.rollout.preemptible=true"],
     "runtime.rollout.preemptible", "colocated"),
    (["runtime.compute=emulated", "runtime.testbed=h200x16-flux", "runtime.rollout.max_workers=4"],
     "runtime.rollout.max_workers", "emulated"),
    (["run.mode=local", "runtime.rollout.preemptible=true"], "runtime.rollout.preemptible", "run.mode=local"),
    (["run.mode=local", "runtime.rollout.max_workers=4"], "runtime.rollout.max_workers", "run.mode=local"),
])
def test_spot_keys_act_on_a_rollout_pool_only(overrides, key, why):
    _refused(overrides, key, why)


def test_a_preemption_trace_is_read_before_the_run(tmp_path):
    from digenrl.sched.preemption import Notice, write_trace

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "notice", "at_s": 1.0, "worker": "rollout-0"}\n')
    _refused(["runtime.rollout.preemptible=true", f"runtime.rollout.preemptions={bad}"],
             "runtime.rollout.preemptions", "bad.jsonl:1", "notice_s")
    _refused(["runtime.rollout.preemptible=true", f"runtime.rollout.preemptions={tmp_path}/none.jsonl"],
             "runtime.rollout.preemptions")
    good = tmp_path / "good.jsonl"
    write_trace(good, [Notice(1.0, "rollout-0", 30.0)])
    _refused([f"runtime.rollout.preemptions={good}"], "runtime.rollout.preemptions", "preemptible=true")
    cfg = load_config(None, ["runtime.rollout.preemptible=true", f"runtime.rollout.preemptions={good}",
                             "runtime.rollout.max_workers=4"])
    assert cfg.runtime.rollout.preemptible and cfg.runtime.rollout.max_workers == 4


def test_dpo_and_flow_dppo_keys_reach_the_learner_or_are_refused():
    """train.loss=dpo's keys (dpo_beta, dpo_pairs, dpo_margin) and flow-dppo's kl_mask_threshold
    act with their loss (tests/learner/test_dpo_learner.py); elsewhere, and the settings that
    cut a prompt group across Train units or a pair across passes, are refused, named."""
    from digenrl.train.trainer import learner_config

    lc = learner_config(load_config(None, ["train.loss=dpo", "train.dpo_beta=20", "train.dpo_pairs=margin",
                                           "train.dpo_margin=0.5", "sampling.sde=ode"]))
    assert (lc.loss, lc.dpo_beta, lc.dpo_pairs, lc.dpo_margin) == ("dpo", 20.0, "margin", 0.5)
    assert learner_config(load_config(None, ["train.loss=flow-dppo", "train.kl_mask_threshold=1e-4"])
                          ).kl_mask_threshold == 1e-4
    _refused(["train.dpo_beta=20"], "train.dpo_beta", "train.loss=grpo")
    _refused(["train.loss=dpo", "train.dpo_pairs=all"], "train.dpo_pairs", "best-worst, margin")
    _refused(["train.loss=dpo", "train.dpo_margin=0.5"], "train.dpo_margin", "margin")
    _refused(["train.kl_mask_threshold=1e-4"], "train.kl_mask_threshold", "flow-dppo")
    _refused(["train.loss=dpo", "train.beta=0.01"], "train.beta", "train.dpo_beta")
    _refused(["train.loss=dpo", "train.backward_batch=2"], "train.backward_batch", "one pass")
    _refused(["train.loss=dpo", "train.behaviour_logp=recompute"], "train.behaviour_logp", "rollout")
    _refused(["train.loss=flow-dppo", "train.clip_range=0.2"], "train.clip_range", "no ratio clip")
    _refused(["train.loss=flow-dppo", "sampling.sde=cps"], "train.loss", "sampling.sde=cps")
    _refused(["train.loss=flow-dppo", "sampling.sde=ode"], "sampling.sde", "no log-probs")
    _refused(["train.loss=dpo", "run.mode=gap", "data.micro_batch_samples=2"], "data.micro_batch_samples", "dpo")
    _refused(["train.loss=dpo", "run.mode=gap+tsp", "runtime.train_shard=2"], "runtime.train_shard", "dpo")
    _refused(["train.loss=dpo", "run.mode=gap+tsp", "runtime.trainer.workers=2", "runtime.trainer.gang=2",
              "runtime.trainer.shard=fsdp", "model.lora_rank=0"], "train.loss", "use LoRA")


# -- runtime.trainer.tag_offload: a trainer's TAG switch (runtime/tag_switch.py) -------------------
def test_tag_offload_acts_where_trainers_generate_or_is_refused():
    for mode in ("gap+tsp+tag", "digenrl", "colocated"):
        for value in ("auto", "always", "never"):
            assert load_config(None, [f"run.mode={mode}", f"runtime.trainer.tag_offload={value}"]) \
                .runtime.trainer.tag_offload == value
    for mode in ("local", "disagg-sync", "one-step-off", "gap", "gap+tsp"):
        _refused([f"run.mode={mode}", "runtime.trainer.tag_offload=always"], "runtime.trainer.tag_offload", mode)
        load_config(None, [f"run.mode={mode}"])  # auto, the default, is fine everywhere
    _refused(["runtime.trainer.tag_offload=sometimes"], "runtime.trainer.tag_offload")
    _refused(["runtime.rollout.tag_offload=never"], "runtime.rollout.tag_offload", "runtime.trainer")
    _refused(["runtime.reward.tag_offload=always"], "runtime.reward.tag_offload", "runtime.trainer")
    load_config(None, ["run.mode=gap+tsp+tag", "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp",
                       "runtime.trainer.tag_offload=always"])  # a gang's ranks move their shards


def test_a_probe_measures_a_step_between_its_first_and_its_last():
    for bad in ("1", "2", "-1"):
        _refused([f"runtime.plan_probe_steps={bad}"], "runtime.plan_probe_steps", ">= 3")
    assert load_config(None, ["runtime.plan_probe_steps=0"]).runtime.plan_probe_steps == 0  # no probe
    assert load_config(None, []).runtime.plan_probe_steps is None  # 4 on CPU pools, none on GPU pools
    _refused(["runtime.plan=never", "runtime.plan_probe_steps=5"], "runtime.plan_probe_steps", "nothing is planned")
    _refused(["runtime.compute=emulated", "runtime.testbed=h200x16-flux", "runtime.plan_probe_steps=5"],
             "runtime.plan_probe_steps", "runtime.compute=emulated")
