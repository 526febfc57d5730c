"""Qwen-VL processors (Qwen2VLProcessor, Qwen3VLProcessor) for images and text, without torchvision.

transformers (5.24, 5.25) can neither build nor load these processors when torchvision is
missing, although images and text never use the video processor: the constructor checks each
sub-processor's class against `VideoProcessorMixin`, which the top-level `transformers` module
only exports with torchvision (transformers@v5.25.0 src/transformers/processing_utils.py:
`check_argument_for_proper_class` 1136-1157, `get_possibly_dynamic_module` 2136-2158:
"VIDEO_PROCESSOR_MAPPING has no attribute _extra_content"), and `from_pretrained` loads an
`AutoVideoProcessor`, whose classes need torchvision. `image_only_processor` loads the
folder's tokenizer (with its chat template) and image processor (`Qwen2VLImageProcessor` falls
back to `Qwen2VLImageProcessorPil`) and builds the processor with no video processor; the
families' `from_pretrained` use it when torchvision is absent (qwen_image_edit.py,
qwen_image21.py).

Difference from a torchvision install: the PIL backend resizes and normalizes with PIL/numpy
instead of torchvision; transformers' own tests hold the two backends to pixel values within
atol 0.1 / rtol 1e-3 with a mean absolute difference under 5e-3 (`test_backends_equivalence`
in tests/test_image_processing_common.py), not to equality.
"""

from __future__ import annotations

from typing import Any


def torchvision_available() -> bool:
    from transformers.utils import is_torchvision_available

    return bool(is_torchvision_available())


def image_only_processor(path_or_id: str, processor_class: str, subfolder: str = "processor", **kwargs: Any):
    """`processor_class` (a transformers Qwen-VL processor) from `subfolder` of a pipeline
    folder or hub id, without a video processor. kwargs go to both `from_pretrained` calls
    (local_files_only, ...)."""
    import transformers
    from transformers import AutoTokenizer, Qwen2VLImageProcessor

    base = getattr(transformers, processor_class)

    class ImageOnlyProcessor(base):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImageOnlyProcessor.__name__ = ImageOnlyProcessor.__qualname__ = f"ImageOnly{processor_class}"
    tokenizer = AutoTokenizer.from_pretrained(path_or_id, subfolder=subfolder, **kwargs)
    image_processor = Qwen2VLImageProcessor.from_pretrained(path_or_id, subfolder=subfolder, **kwargs)
    return ImageOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                              chat_template=getattr(tokenizer, "chat_template", None))
