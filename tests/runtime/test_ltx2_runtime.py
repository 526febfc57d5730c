"""LTX-2 (video + audio) end to end (issue 28's "Must show"): a tiny LTX-2 trains two steps under
run.mode=local and under the Ray runtime in gap+tsp, and both end at the same weights (the
trajectory latent holds the video and the audio tokens, so both streams' SDE steps are trained
and reproduced); then `digenrl sample` on the local run writes a readable .wav beside each .gif.

The rewards: jpeg-compressibility of the frames plus `clap` (a tiny random CLAP) of each sample's
decoded audio against its prompt, so the audio travels rollout -> rewarder in the single-device
trainer and in the Ray rollout workers alike: both runs give the same clap scores.
"""

import json
import wave

import pytest

from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.train.trainer import Trainer

from tests.helpers.equivalence import assert_matches_single_device

from .conftest import tiny

pytest.importorskip("diffusers")

LTX2 = ["model.name=ltx2", "model.height=32", "model.width=32", "model.frames=5", "model.max_sequence_length=8",
        "model.lora_rank=4", "model.lora_alpha=8", "reward.weights={jpeg-compressibility: 1.0, clap: 1.0}", "train.lr=1e-3",
        "sampling.num_steps=3", "sampling.eval_num_steps=3", "data.groups_per_step=2"]


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory) -> str:
    from tests.models.tiny_diffusers_more import build_ltx2

    return str(build_ltx2(tmp_path_factory.mktemp("ltx2")))


@pytest.fixture(scope="module")
def clap(tmp_path_factory) -> str:
    from tests.helpers.tiny_clap import build_tiny_clap

    return str(build_tiny_clap(tmp_path_factory.mktemp("clap")))


@pytest.mark.slow
def test_ltx2_gap_tsp_matches_single_device_and_sample_writes_wav(ray_cluster, tmp_path, ltx2, clap):
    from digenrl.runtime.driver import RayDriver
    from digenrl.tools.cli import main

    local = tmp_path / "local"
    Trainer(load_config(None, tiny(local, "local", *LTX2, f"model.path={ltx2}", f"reward.paths.clap={clap}")), progress=False).train()
    run = tmp_path / "ray"
    RayDriver(load_config(None, tiny(run, "gap+tsp", *LTX2, f"model.path={ltx2}", f"reward.paths.clap={clap}",
                                          "train.tsp_chunk=1")),
              progress=False, evaluate=False).train()

    assert_matches_single_device(run, local)
    records = [r for r in read_metrics(run) if r["step"] > 0]
    ref = [r for r in read_metrics(local) if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2] and records[0]["ratio_mean"] == 1.0
    for a, b in zip(records, ref):  # the same samples -> the same rewards
        for name in ("jpeg-compressibility", "clap"):
            assert a[f"rollout/{name}"] == pytest.approx(b[f"rollout/{name}"], abs=1e-6), name
    assert all(-1.0 <= r["rollout/clap"] <= 1.0 and r["rollout/clap"] != 0.0 for r in records)

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    out = tmp_path / "samples"
    assert main(["sample", "--run-dir", str(local), "--prompts", str(prompts), "--samples", "2", "--out", str(out),
                 "--quiet"]) == 0
    meta = json.loads((out / "samples.json").read_text())
    assert len(meta["samples"]) == 2
    for row in meta["samples"]:
        assert row["file"].endswith(".gif") and row["audio"] == row["file"][:-4] + ".wav"
        with wave.open(str(out / row["audio"])) as f:
            # the tiny vocoder: 2 channels at 16 kHz; 5 audio latents -> 68 samples (LTX2Pipeline's own
            # length for this folder, test_ltx2.py compares the waveform with it)
            assert (f.getnchannels(), f.getsampwidth(), f.getframerate(), f.getnframes()) == (2, 2, 16000, 68)
