"""Audio-text reward: CLAP (Wu et al. 2023, arXiv 2211.06687) through transformers' ClapModel.

    ClapScore(path)(images, prompts, audio=(B, C, S) in [-1, 1], audio_rate=Hz) -> (B,) in [-1, 1]

`path` is a local folder holding a ClapModel (config.json + weights), its feature extractor
(preprocessor_config.json: ClapFeatureExtractor) and its RoBERTa tokenizer, as
`laion/larger_clap_general` or `laion/clap-htsat-unfused` download. Nothing is downloaded.

The score is the cosine of the audio embedding and the prompt's text embedding, with no
logit scale: CLAP score as audio generators report it (Make-An-Audio, arXiv 2301.12661),
and as the LTX-2.3 text-to-audio-video CLAP rewards score it (Tencent-Hunyuan/UniRL pull
request 168, `CLAPRewardScorer`: normalised `audio_embeds` . `text_embeds` of ClapModel, fp32,
mono, resampled to 48 kHz; verl-project/verl-omni's CLAP scorer for LTX-2.3, pull request 640
per its issue 432, was not read here). transformers' ClapModel.get_audio_features /
get_text_features already return unit vectors (transformers@v5.25.0
src/transformers/models/clap/modeling_clap.py:1494 and :1530); the reward
computes the same (tower, projection, normalise) and takes the dot product.

Audio path: channels are averaged to mono, resampled in torch to the feature extractor's
`sampling_rate` (48 kHz for CLAP) by `resample_audio`, and cut to its `max_length_s` (10 s)
from the start. Two departures from calling ClapProcessor as is, both for a reward that is a
deterministic, batch-independent function of its sample: longer audio is cut at the start
instead of the extractor's random crop (`rand_trunc`) or random chunks (`fusion`), and
`is_longer` is the true flag (False after the cut) instead of the extractor's random pick of
one sample in a batch with `truncation="fusion"` (transformers@v5.25.0
src/transformers/models/clap/feature_extraction_clap.py:349-352).
The video frames (`images`) are not used.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from digenrl.rewards.base import check_media, embed_each_prompt_once


def _lowpass_kernels(up: int, down: int, zeros: int, rolloff: float) -> tuple[torch.Tensor, int]:
    """(up, 2 * half + down) float64 kernels, one per output phase, and the half width `half`.

    Output sample n = m * up + j sits at input position m * down + j * down / up; its kernel
    weighs input samples m * down + r for r in [-half, half + down). The filter is a
    Hann-windowed sinc with cutoff `rolloff` x the lower of the two Nyquist frequencies,
    `zeros` zero crossings each side.
    """
    fc = min(1.0, up / down) * rolloff  # cutoff, as a fraction of the input Nyquist frequency
    half = math.ceil(zeros / fc)
    r = torch.arange(-half, half + down, dtype=torch.float64)  # (L,)
    offsets = torch.arange(up, dtype=torch.float64) * down / up  # (up,)
    d = offsets[:, None] - r[None, :]  # distance from each output phase to each tap, input samples
    window = torch.where(d.abs() <= half, torch.cos(math.pi * d / (2 * half)) ** 2, torch.zeros_like(d))
    return fc * torch.sinc(fc * d) * window, half


def resample_audio(audio: torch.Tensor, orig_rate: int, new_rate: int, *, zeros: int = 16,
                   rolloff: float = 0.95) -> torch.Tensor:
    """(..., S) sampled at orig_rate -> (..., ceil(S * new_rate / orig_rate)) at new_rate.

    Polyphase windowed-sinc resampling by the reduced ratio new_rate / orig_rate (one strided
    conv1d with one kernel per output phase), the method of torchaudio.functional.resample
    and scipy.signal.resample_poly, neither a dependency here. Edges see zeros outside the
    signal. Computed in float64, returned in the input's dtype. Same rates: returned as is.
    """
    if orig_rate <= 0 or new_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_rate} -> {new_rate}")
    if orig_rate == new_rate:
        return audio
    g = math.gcd(int(orig_rate), int(new_rate))
    up, down = new_rate // g, orig_rate // g
    kernels, half = _lowpass_kernels(up, down, zeros, rolloff)
    if kernels.numel() > 50_000_000:
        raise ValueError(f"resampling {orig_rate} -> {new_rate} Hz needs {up} x {kernels.shape[1]} filter taps; "
                         "use rates with a larger common divisor")
    lead, n = audio.shape[:-1], audio.shape[-1]
    x = audio.reshape(-1, 1, n).to(torch.float64)
    x = F.pad(x, (half, half + down))
    y = F.conv1d(x, kernels.to(x.device)[:, None, :], stride=down)  # (N, up, M): phase j of block m
    y = y.transpose(1, 2).reshape(x.shape[0], -1)  # sample m * up + j
    n_out = -(-n * up // down)
    return y[:, :n_out].reshape(*lead, n_out).to(audio.dtype)


class ClapScore:
    """CLAP score: cos(audio embedding, prompt embedding) of a transformers ClapModel, in [-1, 1]."""

    name = "clap"
    wants_audio = True  # AsyncRewarder passes audio= and audio_rate= only to rewards that set this

    def __init__(
        self,
        path: str,
        *,
        device: str | torch.device = "cpu",
        batch_size: int = 8,
        local_files_only: bool = True,
    ):
        from transformers import AutoTokenizer, ClapFeatureExtractor, ClapModel

        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
        self.device = torch.device(device)
        # float32: the audio tower's BatchNorm (as UniRL's scorer notes, fp16/bf16 are not safe there)
        model = ClapModel.from_pretrained(path, local_files_only=local_files_only)
        self.model = model.to(device=self.device, dtype=torch.float32).eval().requires_grad_(False)
        self.features = ClapFeatureExtractor.from_pretrained(path, local_files_only=local_files_only)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_files_only)
        # RoBERTa positions start after the padding index: the table holds max_position_embeddings - 2 tokens
        self.max_length = min(self.tokenizer.model_max_length,
                              self.model.config.text_config.max_position_embeddings - 2)
        self.batch_size = batch_size

    @property
    def sampling_rate(self) -> int:
        return int(self.features.sampling_rate)

    def waveforms(self, audio: torch.Tensor, audio_rate: int) -> torch.Tensor:
        """(B, C, S) in [-1, 1] at audio_rate -> (B, S') mono at the extractor's rate, at most max_length_s long."""
        if not isinstance(audio, torch.Tensor) or audio.ndim != 3 or not audio.is_floating_point():
            shape = tuple(audio.shape) if isinstance(audio, torch.Tensor) else type(audio).__name__
            raise ValueError(f"audio must be a float tensor (B, channels, samples), got {shape}")
        if audio_rate is None or int(audio_rate) <= 0:
            raise ValueError(f"audio_rate: the audio's sample rate in Hz is required, got {audio_rate!r}")
        mono = audio.detach().float().cpu().mean(dim=1)  # (B, S)
        mono = resample_audio(mono, int(audio_rate), self.sampling_rate)
        return mono[:, : int(self.features.nb_max_samples)]

    def input_features(self, waves: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, S) waveforms -> ClapFeatureExtractor's input_features and the true is_longer (all False)."""
        feats = self.features([w.double().numpy() for w in waves], sampling_rate=self.sampling_rate,
                              return_tensors="pt")
        return feats["input_features"], torch.zeros(waves.shape[0], 1, dtype=torch.bool)

    @torch.no_grad()
    def audio_embeds(self, waves: torch.Tensor) -> torch.Tensor:
        """(N, S) mono waveforms at the extractor's rate -> (N, D) unit-norm float32."""
        features, is_longer = self.input_features(waves)
        # ClapModel.get_audio_features, spelled out (transformers 4.x returns a tensor, 5.x an output)
        pooled = self.model.audio_model(input_features=features.to(self.device, torch.float32),
                                        is_longer=is_longer.to(self.device)).pooler_output
        return F.normalize(self.model.audio_projection(pooled).float(), dim=-1)

    @torch.no_grad()
    def text_embeds(self, prompts: Sequence[str]) -> torch.Tensor:
        """N prompts -> (N, D) unit-norm float32."""
        tok = self.tokenizer(list(prompts), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt").to(self.device)
        pooled = self.model.text_model(input_ids=tok.input_ids, attention_mask=tok.attention_mask).pooler_output
        return F.normalize(self.model.text_projection(pooled).float(), dim=-1)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str], *, audio: torch.Tensor,
                 audio_rate: int) -> torch.Tensor:
        check_media(images, prompts)
        if isinstance(audio, torch.Tensor) and audio.ndim >= 1 and audio.shape[0] != images.shape[0]:
            raise ValueError(f"got {images.shape[0]} samples but audio for {audio.shape[0]}")
        waves = self.waveforms(audio, audio_rate)
        text = embed_each_prompt_once(self.text_embeds, prompts).cpu()  # (B, D)
        scores = []
        for i in range(0, waves.shape[0], self.batch_size):
            a = self.audio_embeds(waves[i : i + self.batch_size]).cpu()
            scores.append((a * text[i : i + self.batch_size]).sum(dim=-1))
        return torch.cat(scores) if scores else torch.zeros(0)
