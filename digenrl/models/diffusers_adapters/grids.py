"""Which families build their sampling grid from a diffusers scheduler (sampling.sigmas), and the
scheduler configs published for them, without torch: the configuration checks these names.
The grids themselves are built in `sigmas.py`."""

from __future__ import annotations

from typing import Any

SIGMA_GRIDS = ("digenrl", "diffusers")

# scheduler/scheduler_config.json of each family's reference checkpoint (the keys that differ
# from the class defaults): stabilityai/stable-diffusion-3.5-medium, black-forest-labs/FLUX.1-dev,
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers (480p: flow_shift 3.0), Qwen/Qwen-Image,
# hunyuanvideo-community/HunyuanVideo.
PUBLISHED_SCHEDULERS: dict[str, dict[str, Any]] = {
    "sd3": {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0},
    "flux": {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0,
             "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
             "base_image_seq_len": 256, "max_image_seq_len": 4096},
    "wan": {"_class_name": "UniPCMultistepScheduler", "num_train_timesteps": 1000, "flow_shift": 3.0,
            "use_flow_sigmas": True, "prediction_type": "flow_prediction", "final_sigmas_type": "zero",
            "solver_order": 2, "solver_type": "bh2", "predict_x0": True, "lower_order_final": True},
    "qwen-image": {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0,
                   "use_dynamic_shifting": True, "time_shift_type": "exponential", "base_shift": 0.5,
                   "max_shift": 0.9, "base_image_seq_len": 256, "max_image_seq_len": 8192,
                   "shift_terminal": 0.02},
    "hunyuan-video": {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 7.0},
}
# families whose grid is built but has no published fallback: the folder's config is required
FOLDER_ONLY = ("flux2", "qwen-image-2.1", "sana", "sana-video", "hunyuan-video-1.5", "ltx2", "cosmos-predict2.5")
GRID_FAMILIES = (*PUBLISHED_SCHEDULERS, *FOLDER_ONLY)  # sampling.sigmas=diffusers is built for these
# Conditioned families sample on their base family's grid. Their published fallback is the base
# family's too: we could not read the Kontext / Edit / I2V checkpoints' scheduler configs offline,
# so a pipeline folder's own config (always preferred, see load_scheduler) is the one to trust.
BASE_FAMILY = {"flux-kontext": "flux", "qwen-image-edit": "qwen-image", "wan-i2v": "wan",
               "hunyuan-video-1.5-i2v": "hunyuan-video-1.5"}
