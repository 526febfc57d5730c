"""Tiny Qwen-Image and Qwen-Image-Edit pipelines WITH their Qwen2.5-VL text side (no hub access).

- tokenizer: a byte-level BPE (`Qwen2Tokenizer`'s own pre-tokenizer) trained in-process on the
  pipelines' prompt templates, so each template word is one token, as in Qwen's vocabulary:
  the templates' prefixes are then exactly the pipelines' `prompt_template_encode_start_idx`
  tokens (64 for the edit template, up to `<|vision_start|>`; 34 for text-to-image), and the
  dropped prefix is the system prompt, as on the real checkpoints (Qwen-Image 2.1 counts its
  system message with the processor's chat template, CHAT_TEMPLATE here). Other text falls back to
  byte tokens. Special tokens: Qwen2.5-VL's chat and vision markers.
- text encoder: a 2-layer `Qwen2_5_VLForConditionalGeneration` (hidden 16 = the tiny
  transformer's joint_attention_dim) with a 2-block vision tower (patch 14, merge 2).
- processor (edit only): `Qwen2VLImageProcessor` (without torchvision transformers returns
  `Qwen2VLImageProcessorPil`) with min_pixels 56*56, so a 16x16 reference is resized to 56x56:
  a 4x4 patch grid, 4 image tokens after the 2x2 merge. Saved as a Qwen2VLProcessor folder
  (processor_config.json + tokenizer files); loaded by QwenImageEditPolicy.from_pretrained,
  which builds an image-only processor without torchvision (vl_processor.py).
- Qwen-Image 2.1: a 2-layer `Qwen3VLForConditionalGeneration` (vision patch 16) and a
  Qwen3VLProcessor folder with the chat template; its pipeline encodes text only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from tests.models.tiny_diffusers import build_qwen_image, build_qwen_image_edit
from tests.models.tiny_diffusers_more import QWEN21_TEXT, build_qwen_image21

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>")
HIDDEN = 16  # the tiny QwenImageTransformer2DModel's joint_attention_dim (tiny_diffusers.py)


# Qwen-Image 2.1's processor chat template, enough for the pipeline's system-message read
# (pipeline_qwenimage21.py ~229): each message as <|im_start|>role\ntext<|im_end|>\n.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}"
)


def _templates() -> list[str]:
    from diffusers import QwenImage21Pipeline, QwenImageEditPipeline, QwenImagePipeline

    from digenrl.models.diffusers_adapters.qwen_image21 import NoProcessor

    edit = QwenImageEditPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, processor=None,
                                 transformer=None)
    t2i = QwenImagePipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=None)
    v21 = QwenImage21Pipeline(scheduler=None, vae=None, text_encoder=None, processor=NoProcessor(), transformer=None)
    return [edit.prompt_template_encode, t2i.prompt_template_encode, v21.prompt_template_t2i]


def qwen_tokenizer():
    """A Qwen2Tokenizer whose vocabulary holds the pipelines' template words whole (see above)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    special = "|".join(map(re.escape, SPECIAL_TOKENS))
    corpus = [part for t in _templates() for part in re.split(special, t.replace("{}", "")) if part]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([  # as Qwen2Tokenizer's
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=4096, min_frequency=1, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    return tok


def qwen_vl_text_encoder(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))))
    cfg = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
            bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=56, out_hidden_size=HIDDEN,
                           fullatt_block_indexes=[1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(cfg).eval()


def build_qwen_image_text(root: Path) -> Path:
    """tiny_diffusers.build_qwen_image plus its Qwen2.5-VL text encoder and tokenizer."""
    from diffusers import QwenImagePipeline

    build_qwen_image(root)
    base = QwenImagePipeline.from_pretrained(root, text_encoder=None, tokenizer=None)
    tok = qwen_tokenizer()
    QwenImagePipeline(scheduler=base.scheduler, vae=base.vae, transformer=base.transformer,
                      text_encoder=qwen_vl_text_encoder(tok), tokenizer=tok).save_pretrained(root)
    return root


def save_qwen_vl_processor(folder: Path, tokenizer, processor_class: str = "Qwen2VLProcessor", patch_size: int = 14,
                           min_pixels: int = 56 * 56, max_pixels: int = 56 * 56 * 4) -> None:
    """A Qwen2VLProcessor folder as a torchvision-equipped save would write it, written here
    without torchvision: tokenizer files + processor_config.json (image processor config; the
    video processor's, which images never use, names Qwen2VLVideoProcessor)."""
    from transformers import Qwen2VLImageProcessor

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    image = Qwen2VLImageProcessor(patch_size=patch_size, min_pixels=min_pixels, max_pixels=max_pixels).to_dict()
    image["image_processor_type"] = "Qwen2VLImageProcessor"
    video = {k: image[k] for k in ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std")}
    video["video_processor_type"] = processor_class.replace("Processor", "VideoProcessor")
    config = {"image_processor": image, "video_processor": video, "processor_class": processor_class}
    (folder / "processor_config.json").write_text(json.dumps(config, indent=2))


def build_qwen_image_edit_text(root: Path) -> Path:
    """tiny_diffusers.build_qwen_image_edit plus its Qwen2.5-VL text encoder, tokenizer and processor."""
    from diffusers import QwenImageEditPipeline

    build_qwen_image_edit(root)
    base = QwenImageEditPipeline.from_pretrained(root, text_encoder=None, tokenizer=None, processor=None)
    tok = qwen_tokenizer()
    QwenImageEditPipeline(scheduler=base.scheduler, vae=base.vae, transformer=base.transformer,
                          text_encoder=qwen_vl_text_encoder(tok), tokenizer=tok, processor=None).save_pretrained(root)
    save_qwen_vl_processor(root / "processor", tok)
    index = json.loads((root / "model_index.json").read_text())
    index["processor"] = ["transformers", "Qwen2VLProcessor"]
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root


def qwen3_vl_text_encoder(tokenizer):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))))
    cfg = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=QWEN21_TEXT, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
            pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=16,
                           out_hidden_size=QWEN21_TEXT, num_position_embeddings=16, deepstack_visual_indexes=[1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    return Qwen3VLForConditionalGeneration(cfg).eval()


def build_qwen_image21_text(root: Path) -> Path:
    """tiny_diffusers_more.build_qwen_image21 plus a tiny Qwen3-VL text encoder and a
    Qwen3VLProcessor folder (tokenizer with CHAT_TEMPLATE, image processor config)."""
    build_qwen_image21(root)
    tok = qwen_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    qwen3_vl_text_encoder(tok).save_pretrained(root / "text_encoder")
    save_qwen_vl_processor(root / "processor", tok, "Qwen3VLProcessor", patch_size=16, min_pixels=64 * 64)
    index = json.loads((root / "model_index.json").read_text())
    index["text_encoder"] = ["transformers", "Qwen3VLForConditionalGeneration"]
    index["processor"] = ["transformers", "Qwen3VLProcessor"]
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root
