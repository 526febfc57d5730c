"""The one protocol every generator implements, and helpers over prompt conditions.

A policy is a velocity field v(x, sigma | prompt) plus what the RL loop needs around it:
turning prompts into condition tensors, the latent shape to sample, and decoding final
latents into images or videos for the rewards. The tiny DiT and every diffusers adapter
implement it; rollout, learner and runtime see nothing else.

Conditioned policies (edit models, image-to-video) also take one image per row: their
`conditioning` names what it is ("reference-image": the source of an edit; "first-frame":
the start of a video), and `encode_inputs(policy, prompts, images)` turns prompts and
images into one Cond. The image's entries (VAE latents, image-encoder states) are plain
Cond entries, so they ride through rollout, trajectories (Ray ObjectRefs) and training
with no transport of their own:

    prompts --encode_prompts------\
                                   +--> Cond (B, ...) --> velocity(x, sigma, cond)
    images (B, 3, H, W) [0, 1] ---/     encode_conditions (e.g. reference latents)
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from digenrl.models.families import CONDITIONINGS  # what `conditioning` may be; None: prompts only

# Condition tensors, all batch-first (B, ...): they slice, concatenate and serialize
# (safetensors) without knowing the model. A prompt-embedding cache stores exactly this.
Cond = dict[str, torch.Tensor]

# A Cond entry named NEGATIVE_PREFIX + key is the negative branch's own value of `key` for
# that row, when it depends on the row's image (Qwen-Image-Edit: the negative prompt is
# encoded together with the source image). See `negative_with_conditions`.
NEGATIVE_PREFIX = "negative_"


@runtime_checkable
class Policy(Protocol):
    module: torch.nn.Module  # the denoiser; RL updates its trainable parameters
    latent_shape: tuple[int, ...]  # per sample: (C, H, W) for images, (C, F, H, W) for video
    output: str  # "image" or "video"

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        """Prompts -> condition tensors, batch-first, on the policy's device."""
        ...

    def negative_cond(self, batch: int) -> Cond:
        """The unconditional (empty or negative prompt) condition for classifier-free guidance."""
        ...

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        """Predicted velocity (eps - x0) at x (B, *latent_shape), sigma (B,) in [0, 1].

        sigma is the flow-matching noise level; converting it to the model's own timestep
        convention happens here, once, and nowhere else.
        """
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents -> float32 pixels in [0, 1]: (B, 3, H, W) or (B, F, 3, H, W)."""
        ...


@runtime_checkable
class ConditionedPolicy(Policy, Protocol):
    """A Policy that also takes one conditioning image per row (edit, image-to-video)."""

    conditioning: str  # one of CONDITIONINGS

    def encode_conditions(self, images: torch.Tensor) -> Cond:
        """Images (B, 3, H, W) float in [0, 1] -> the Cond entries they contribute, batch-first
        (e.g. "image_latents"); merged with the prompt entries by `encode_inputs`."""
        ...

    def encode_inputs(self, prompts: Sequence[str], images: torch.Tensor) -> Cond:
        """Prompts and their images -> one Cond: `encode_prompts` merged with `encode_conditions`,
        unless the family's text encoder sees the image too (then it encodes both together)."""
        ...


def conditioning_of(policy: object) -> str | None:
    """What a policy is conditioned on besides its prompt: None, or one of CONDITIONINGS."""
    return getattr(policy, "conditioning", None)


def has_audio(policy: object) -> bool:
    """Whether a policy's samples carry an audio track: it then has `audio_sample_rate` (Hz, int)
    and `decode_audio(latents) -> (B, channels, samples)` float32 in [-1, 1] (ltx2)."""
    return getattr(policy, "audio_sample_rate", None) is not None and hasattr(policy, "decode_audio")


def check_condition_images(images: torch.Tensor, batch: int) -> None:
    """Raise a ValueError that says what was expected when conditioning images are malformed."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] != 3:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"conditioning images must be a (B, 3, H, W) tensor in [0, 1], got {shape}")
    if not images.is_floating_point():
        raise ValueError(f"conditioning images must be floating point in [0, 1], got dtype {images.dtype}")
    if images.shape[0] != batch:
        raise ValueError(f"got {batch} prompts but {images.shape[0]} conditioning images (one per prompt)")


def merge_conds(text: Cond, conditions: Cond) -> Cond:
    """The prompt entries plus the image entries; a name in both is a bug of the adapter."""
    clash = sorted(set(text) & set(conditions))
    if clash:
        raise ValueError(f"conditioning entries {clash} collide with prompt entries of the same name")
    return {**text, **conditions}


def encode_inputs(policy: Policy, prompts: Sequence[str], images: torch.Tensor | None = None) -> Cond:
    """Prompts (and, for a conditioned policy, one image per prompt) -> the Cond of each row.

    An unconditioned policy refuses images, a conditioned one requires them: a silent
    fallback would train an edit model on edits of nothing.
    """
    kind = conditioning_of(policy)
    name = getattr(policy, "family", type(policy).__name__)
    if kind is None:
        if images is not None:
            raise ValueError(f"{name} takes prompts only (no conditioning), but images were given")
        return policy.encode_prompts(prompts)
    if images is None:
        raise ValueError(f"{name} is conditioned on a {kind}: give one image per prompt")
    check_condition_images(images, len(prompts))
    # a prompt group repeats its (prompt, image) row: encode each distinct row once (the VAE,
    # and Wan I2V's whole first-frame video, are the costly part) and repeat its entries
    index: dict[tuple[str, bytes], int] = {}
    rows, inverse = [], []  # the first row of each distinct input; each row's distinct input
    for i, p in enumerate(prompts):
        key = (p, images[i].detach().to("cpu", torch.float32).numpy().tobytes())
        if key not in index:
            index[key] = len(rows)
            rows.append(i)
        inverse.append(index[key])
    if len(rows) == len(prompts):
        return policy.encode_inputs(prompts, images)
    cond = policy.encode_inputs([prompts[i] for i in rows], images[rows])
    return cond_select(cond, inverse)


def negative_with_conditions(cond: Cond, negative: Cond) -> Cond:
    """The negative branch of classifier-free guidance with the rows' conditioning entries.

    The edit and image-to-video pipelines run their unconditional branch on the same
    reference / first frame as the conditional one (diffusers@v0.42.1
    src/diffusers/pipelines/flux/pipeline_flux_kontext.py:1054-1069 and
    src/diffusers/pipelines/wan/pipeline_wan_i2v.py:785-795): every entry of `cond` that the
    (prompt-only) `negative` lacks is taken from `cond`, and an entry NEGATIVE_PREFIX + key of `cond` replaces
    `key` (a negative prompt encoded with the row's image). Unconditioned families have
    the same keys on both sides and pass through unchanged.
    """
    out = {**cond, **negative}
    for k, v in cond.items():
        if k.startswith(NEGATIVE_PREFIX):
            out[k[len(NEGATIVE_PREFIX):]] = v
    return out


def cond_select(cond: Cond, index: torch.Tensor | Sequence[int] | slice) -> Cond:
    return {k: v[index] for k, v in cond.items()}


def cond_cat(conds: Sequence[Cond]) -> Cond:
    keys = conds[0].keys()
    for c in conds[1:]:
        if c.keys() != keys:
            raise ValueError(f"cannot concatenate conditions with keys {sorted(keys)} and {sorted(c.keys())}")
    return {k: torch.cat([c[k] for c in conds]) for k in keys}


def cond_repeat(cond: Cond, repeats: int) -> Cond:
    """Each row repeated `repeats` times in place (a prompt -> its group of samples)."""
    return {k: v.repeat_interleave(repeats, dim=0) for k, v in cond.items()}


def cond_to(cond: Cond, device: torch.device | str) -> Cond:
    return {k: v.to(device) for k, v in cond.items()}


def guided_velocity(
    policy: Policy,
    x: torch.Tensor,
    sigma: torch.Tensor,
    cond: Cond,
    negative: Cond | None = None,
    scale: float = 1.0,
    scale_low: float = 0.0,
) -> torch.Tensor:
    """Classifier-free guidance: v_neg + scale (v_cond - v_neg), both in one batched call.

    scale == 1 (or no negative) is the plain conditional velocity; models with embedded
    guidance (FLUX.1-dev) carry it inside `cond` and use scale 1 here. The negative branch
    sees the rows' conditioning entries (`negative_with_conditions`).

    scale_low: the scale of the rows a two-expert policy's low-noise expert serves (Wan2.2's
    `guidance_scale_2`; `scale` is then the high-noise expert's); 0 = `scale` for every row.
    Which rows those are is the policy's own routing rule (`policy.low_noise_rows(sigma)`),
    so a batch straddling the boundary is split per row, each part guided with its expert's
    scale, and put back in order: every row gets the velocity a batch of its expert alone
    would give it (rollout batches share one sigma; a learner batch may mix steps).
    """
    if scale_low and scale_low != scale:
        low = low_noise_rows(policy, sigma).cpu()  # (B,) bool
        if bool(low.all()):
            scale = scale_low
        elif bool(low.any()):
            rows_high, rows_low = (~low).nonzero().squeeze(1), low.nonzero().squeeze(1)

            def part(rows: torch.Tensor, s: float) -> torch.Tensor:
                neg = None if negative is None else cond_select(negative, rows)
                return _cfg(policy, x[rows], sigma[rows], cond_select(cond, rows), neg, s)

            v = torch.cat([part(rows_high, scale), part(rows_low, scale_low)])  # rows in (high, low) order
            return v[torch.argsort(torch.cat([rows_high, rows_low])).to(v.device)]  # back to the batch's order
    return _cfg(policy, x, sigma, cond, negative, scale)


def low_noise_rows(policy: Policy, sigma: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the rows at sigma (B,) that a two-expert policy's low-noise expert serves.

    Only two-expert policies (Wan2.2 A14B) have a low-noise expert; any other refuses a
    separate low-noise guidance scale rather than ignore it.
    """
    rows = getattr(policy, "low_noise_rows", None)
    if rows is None:
        name = getattr(policy, "family", type(policy).__name__)
        raise ValueError(f"{name} has one transformer: a low-noise expert's guidance scale "
                         "(sampling.cfg_scale_low) applies to two-expert families (wan2.2) only")
    return rows(sigma)


def _cfg(policy: Policy, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, negative: Cond | None,
         scale: float) -> torch.Tensor:
    """One scale for every row: v_neg + scale (v_cond - v_neg) from one doubled batch."""
    if scale == 1.0 or negative is None:
        return policy.velocity(x, sigma, cond)
    negative = negative_with_conditions(cond, negative)
    v = policy.velocity(torch.cat([x, x]), torch.cat([sigma, sigma]), cond_cat([cond, negative]))
    v_cond, v_neg = v.chunk(2)
    return v_neg + scale * (v_cond - v_neg)
