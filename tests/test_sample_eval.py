"""`digenrl sample` and `digenrl eval` on a finished tiny run: weights loaded, same noise,
paired statistics, and every bad input refused before a model loads."""

import json
import math
import shutil
import statistics
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from digenrl.tools.cli import main
from digenrl.config.schema import load_config
from digenrl.models.lora import trainable_state_dict
from digenrl.tools.posthoc import Inputs, sample_images
from digenrl.io.runs import load_policy, resolve_snapshot
from digenrl.train.trainer import Trainer

PROMPTS = ["a red triangle on the top", "two green squares on the top"]  # toy-held-out's first two


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 2-step LoRA run, checkpoints after each step; its Trainer kept (for dcp/)."""
    root = tmp_path_factory.mktemp("sample_eval")
    cfg = load_config(None, [
        f"run.run_dir={root / 'run'}", "run.mode=local", "run.loggers=[]", "model.lora_rank=4",
        "data.groups_per_step=2", "data.group_size=2", "data.micro_batch_groups=2",
        "data.eval_max_prompts=1", "data.eval_samples=1", "sampling.num_steps=3", "sampling.eval_num_steps=3",
        "reward.threads=1", "train.steps=2", "run.checkpoint_every=1", "run.eval_every=0", "train.lr=3e-3",
    ])
    trainer = Trainer(cfg, progress=False)
    trainer.train()
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    return SimpleNamespace(dir=root / "run", prompts=prompts, root=root, trainer=trainer)


def _args(run, **kw):
    base = dict(run_dir=str(run.dir), prompts=str(run.prompts), samples=2, steps=None, seed=None, ema=False,
                set=[], out=str(run.root / "unused"), quiet=True)
    return SimpleNamespace(**{**base, **kw})


def _images(run, step, **kw):
    inputs = Inputs(_args(run, **kw), step)
    policy = load_policy(inputs.cfg, inputs.snap, progress=False)
    return sample_images(inputs, policy, inputs.snap).last_images, policy


def test_sample_writes_one_file_per_sample_and_a_grid(run, tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sample", "--run-dir", str(run.dir), "--prompts", str(run.prompts), "--samples", "2",
                 "--out", str(out), "--quiet"]) == 0
    meta = json.loads((out / "samples.json").read_text())
    assert meta["weights"] == "final (step 2)" and meta["step"] == 2 and meta["samples_per_prompt"] == 2
    assert [(r["prompt"], r["sample"]) for r in meta["samples"]] == [(p, j) for p in PROMPTS for j in range(2)]
    for r in meta["samples"]:
        assert (out / r["file"]).suffix == ".png" and (out / r["file"]).exists()
    assert (out / "grid.png").exists()
    assert "4 samples of final (step 2)" in capsys.readouterr().out


def test_without_prompts_or_out_the_runs_held_out_prompts_go_under_the_run(run, capsys):
    """The run evaluated data.eval_max_prompts=1 of its held-out prompts (toy-held-out): so do they."""
    assert main(["sample", "--run-dir", str(run.dir), "--samples", "2", "--quiet"]) == 0
    out = run.dir / "sample" / "final"
    meta = json.loads((out / "samples.json").read_text())
    assert [(r["prompt"], r["sample"]) for r in meta["samples"]] == [(PROMPTS[0], 0), (PROMPTS[0], 1)]
    assert str(out) in capsys.readouterr().out
    assert Inputs(_args(run, prompts=None, out=None), "1").out == run.dir / "sample" / "step_1"
    assert Inputs(_args(run, prompts=None, out=None), "0", "eval").out == run.dir / "eval" / "base"


def test_adapters_are_loaded_and_change_the_samples(run):
    trained, policy = _images(run, "final")
    final = load_file(str(run.dir / "final" / "policy.safetensors"))
    live = trainable_state_dict(policy.module)
    assert live.keys() == final.keys() and all(k.count("lora_") for k in final)  # adapters only
    assert all(torch.equal(live[k], final[k]) for k in final)
    assert any(bool(v.abs().sum()) for k, v in final.items() if "lora_B" in k)  # trained away from B = 0
    base, _ = _images(run, "0")
    assert trained.shape == base.shape == (len(PROMPTS) * 2, 3, *trained.shape[-2:])
    assert not torch.equal(trained, base)


def test_checkpoint_step_loads_that_checkpoint(run):
    _, policy = _images(run, "1")
    saved = load_file(str(run.dir / "checkpoints" / "step_000001" / "policy.safetensors"))
    live = trainable_state_dict(policy.module)
    assert all(torch.equal(live[k], saved[k]) for k in saved)
    final = load_file(str(run.dir / "final" / "policy.safetensors"))
    assert not all(torch.equal(final[k], saved[k]) for k in saved)  # step 1 is not the final weights


def test_sampling_is_deterministic_and_seeded(run):
    a, _ = _images(run, "final")
    b, _ = _images(run, "final")
    c, _ = _images(run, "final", seed=1)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sharded_checkpoint_loads_the_same_weights(run, tmp_path):
    from digenrl.io.checkpoint import save_sharded

    copy = tmp_path / "run"
    shutil.copytree(run.dir, copy)
    step_dir = copy / "checkpoints" / "step_000009"  # a gang's layout of the final weights
    save_sharded(step_dir, run.trainer.policy.module, run.trainer.learner.optimizer, None)
    (step_dir / "state.json").write_text("{}")
    assert not (step_dir / "policy.safetensors").exists()
    snap = resolve_snapshot(copy, "9")
    cfg = Inputs(_args(run, run_dir=str(copy)), "9").cfg
    live = trainable_state_dict(load_policy(cfg, snap, progress=False).module)
    final = load_file(str(run.dir / "final" / "policy.safetensors"))
    assert live.keys() == final.keys() and all(torch.equal(live[k], final[k]) for k in final)


def test_eval_reports_paired_statistics(run, tmp_path, capsys):
    out = tmp_path / "e"
    assert main(["eval", "--run-dir", str(run.dir), "--prompts", str(run.prompts), "--samples", "3",
                 "--rewards", "toy-geneval,jpeg-compressibility", "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["weights"] == "final (step 2)"
    assert [(s["prompt"], s["sample"]) for s in report["samples"]] == [(p, j) for p in PROMPTS for j in range(3)]
    table = (out / "eval.md").read_text()
    assert table in capsys.readouterr().out
    for name in ("toy-geneval", "jpeg-compressibility"):
        r = report["rewards"][name]
        base, trained = r["base"], r["trained"]
        assert len(base) == len(trained) == r["n"] == 6
        # by hand: d_i = trained_i - base_i; se = stdev(d) / sqrt(n); t = mean(d) / se
        d = [t - b for b, t in zip(base, trained)]
        assert r["base_mean"] == pytest.approx(statistics.fmean(base))
        assert r["trained_mean"] == pytest.approx(statistics.fmean(trained))
        assert r["mean_diff"] == pytest.approx(statistics.fmean(d))
        assert r["se"] == pytest.approx(statistics.stdev(d) / math.sqrt(6))
        assert r["t"] == pytest.approx(statistics.fmean(d) / (statistics.stdev(d) / math.sqrt(6)))
        assert f"| {name} | 6 | {r['base_mean']:.4f} | {r['trained_mean']:.4f} | {r['mean_diff']:+.4f} |" in table
    assert report["rewards"]["jpeg-compressibility"]["base"] != report["rewards"]["jpeg-compressibility"]["trained"]
    # toy-geneval's criteria and its all-correct rate, each paired the same way
    parts = [k for k in report["rewards"] if k.startswith("toy-geneval/")]
    assert parts == [f"toy-geneval/{c}" for c in ("color", "count", "shape", "position", "strict")]
    strict = report["rewards"]["toy-geneval/strict"]
    assert set(strict["base"]) | set(strict["trained"]) <= {0.0, 1.0} and strict["n"] == 6
    assert f"| toy-geneval/strict | 6 | {strict['base_mean']:.4f} |" in table


def test_eval_of_the_base_against_itself_is_zero(run, tmp_path, capsys):
    out = tmp_path / "e0"
    assert main(["eval", "--run-dir", str(run.dir), "--step", "0", "--prompts", str(run.prompts), "--samples", "2",
                 "--rewards", "jpeg-compressibility", "--out", str(out), "--quiet"]) == 0
    r = json.loads((out / "eval.json").read_text())["rewards"]["jpeg-compressibility"]
    assert r["base"] == r["trained"] and r["mean_diff"] == 0.0 and r["se"] == 0.0 and r["t"] is None
    assert "| jpeg-compressibility | 4 |" in capsys.readouterr().out


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a policy is ever built: every error must come before that."""
    import digenrl.models

    def refuse(*args, **kwargs):
        raise AssertionError("bad input reached build_policy: work started")

    monkeypatch.setattr(digenrl.models, "build_policy", refuse)


@pytest.mark.parametrize("command", ["sample", "eval"])
@pytest.mark.parametrize("bad, message", [
    ({"--run-dir": "MISSING"}, "is not a directory"),
    ({"--step": "7"}, "available: 0, 1, 2, final"),
    ({"--prompts": "MISSING"}, "--prompts: prompt file"),
    ({"--set": "train.bogus=1"}, "train.bogus: unknown key"),
    ({"--samples": "0"}, "--samples: must be >= 1"),
    ({"--ema": None}, "no ema.safetensors"),
])
def test_bad_inputs_are_refused_before_work(run, tmp_path, capsys, no_model, command, bad, message):
    opts = {"--run-dir": str(run.dir), "--prompts": str(run.prompts), "--out": str(tmp_path / "o")}
    opts.update({k: (str(tmp_path / "missing") if v == "MISSING" else v) for k, v in bad.items()})
    argv = [command, "--quiet"] + [w for k, v in opts.items() for w in ([k] if v is None else [k, v])]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rewards, message", [("nope", "'nope' is unknown"),
                                              ("pickscore", "--set reward.paths.pickscore=")])
def test_eval_refuses_rewards_it_cannot_build(run, tmp_path, capsys, no_model, rewards, message):
    assert main(["eval", "--run-dir", str(run.dir), "--prompts", str(run.prompts), "--rewards", rewards,
                 "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_run_dir_without_config_is_refused(tmp_path, capsys, no_model):
    assert main(["sample", "--run-dir", str(tmp_path), "--prompts", "toy", "--out", str(tmp_path / "o")]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_set_overrides_the_run_config(run):
    inputs = Inputs(_args(run, set=["sampling.cfg_scale=2.0"], steps=5, seed=3, samples=3), "final")
    c = inputs.cfg
    assert (c.sampling.cfg_scale, c.sampling.eval_num_steps, c.run.seed, c.data.eval_samples) == (2.0, 5, 3, 3)
    assert c.model.lora_rank == 4  # the rest as the run saved it


def test_videos_become_animated_gifs_and_grid_shows_first_frames(tmp_path):
    from PIL import Image

    from digenrl.io.media import save_prompt_grid, save_sample

    # (B=2, F=3, 3, H=8, W=8): frame f of video b is flat gray (b * 3 + f) / 6
    videos = torch.arange(6.0).div(6).view(2, 3, 1, 1, 1).expand(2, 3, 3, 8, 8).contiguous()
    out = save_sample(videos[1], tmp_path / "v")
    assert out.suffix == ".gif"
    with Image.open(out) as gif:
        assert gif.n_frames == 3
        grays = []
        for f in range(3):
            gif.seek(f)
            grays.append(gif.convert("RGB").getpixel((0, 0))[0])
    assert grays == [round((3 + f) / 6 * 255) for f in range(3)]
    grid = save_prompt_grid(videos, ["p"], 2, tmp_path / "grid.png")
    with Image.open(grid) as g:
        right = g.convert("RGB").getpixel((g.width - 1, 0))[0]  # last cell: video 1, frame 0
    assert right == round(3 / 6 * 255)


def test_audio_becomes_a_16_bit_wav_at_its_rate(tmp_path):
    import wave

    from digenrl.io.media import save_wav

    # 2 channels, 100 samples: a ramp on channel 0, its negative on channel 1, one value clipped
    ramp = torch.linspace(-1.0, 1.0, 100)
    audio = torch.stack([ramp, -ramp])
    audio[0, 0] = -3.0
    out = save_wav(audio, tmp_path / "a" / "s", 24000)
    assert out.name == "s.wav"
    with wave.open(str(out)) as f:
        assert (f.getnchannels(), f.getsampwidth(), f.getframerate(), f.getnframes()) == (2, 2, 24000, 100)
        pcm = torch.frombuffer(bytearray(f.readframes(100)), dtype=torch.int16).view(100, 2).T
    assert pcm[0, 0] == -32767 and pcm[0, -1] == 32767 and torch.equal(pcm[1], -pcm[0])
    torch.testing.assert_close(pcm.float() / 32767, audio.clamp(-1, 1), atol=1 / 32767, rtol=0)
    with pytest.raises(ValueError, match="channels, samples"):
        save_wav(ramp, tmp_path / "bad", 24000)


def test_ema_flag_loads_the_ema_weights(run, tmp_path):
    from safetensors.torch import save_file

    copy = tmp_path / "run"
    shutil.copytree(run.dir, copy)
    final = load_file(str(copy / "final" / "policy.safetensors"))
    ema = {k: v * 0.5 for k, v in final.items()}  # stands in for a run with train.ema_decay > 0
    save_file(ema, str(copy / "final" / "ema.safetensors"))
    inputs = Inputs(_args(run, run_dir=str(copy), ema=True), "final")
    live = trainable_state_dict(load_policy(inputs.cfg, inputs.snap, ema=True, progress=False).module)
    assert all(torch.equal(live[k], ema[k]) for k in ema)
