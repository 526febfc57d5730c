"""config.data: the prompts and the shape of an RL step (DataConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.config.errors import ConfigError, check
from digenrl.prompt_sets import PromptSetError, check_spec, parse_spec


@dataclass
class DataConfig:
    """Prompts and the shape of an RL step: prompt groups, samples per group, micro-batches."""

    # "toy", a named set ("pickscore" = its train split, "pickscore:test"; digenrl/prompt_sets:
    # pickscore, ocr, geneval, drawbench), a text file, one prompt per line, or a .jsonl file of
    # {"prompt": ..., "image": path relative to the file} rows (conditioned families need images)
    prompts: str = "toy"
    # the held-out prompts, the same forms (a bare set name = its test split); "auto": toy ->
    # toy-held-out, a named set -> that set's test split, a file -> toy-held-out
    eval_prompts: str = "auto"
    groups_per_step: int = 8  # prompts per RL step
    group_size: int = 4  # samples per prompt (the GRPO group)
    micro_batch_groups: int = 2  # whole groups per generation / training micro-batch
    # > 0: micro-batches of this many samples that may cut prompt groups (flow_grpo's
    # per-GPU batches); only where nothing trains before the whole step is rewarded
    # (run.mode local, colocated, disagg-sync, one-step-off). 0 = whole groups.
    micro_batch_samples: int = 0
    eval_samples: int = 8  # samples per eval prompt (same noise at every evaluation)
    eval_max_prompts: int = 16  # held-out prompts evaluated: the first this many of data.eval_prompts

    def __post_init__(self) -> None:
        check(
            self.group_size >= 2,
            "data.group_size",
            f"must be >= 2: with {self.group_size} sample(s) per prompt every group-relative advantage is 0",
        )
        check(self.groups_per_step >= 1, "data.groups_per_step", "must be >= 1")
        check(
            1 <= self.micro_batch_groups <= self.groups_per_step,
            "data.micro_batch_groups",
            f"must be in [1, groups_per_step={self.groups_per_step}], got {self.micro_batch_groups}",
        )
        check(self.eval_samples >= 1, "data.eval_samples", "must be >= 1")
        check(0 <= self.micro_batch_samples <= self.groups_per_step * self.group_size,
              "data.micro_batch_samples",
              f"must be in [0, samples per step={self.groups_per_step * self.group_size}] (0 = whole groups)")
        # a named set's name and split are checked here, before any file is read; files (and
        # whether a set is fetched) are checked by digenrl/tools/preflight.py
        for key, spec, held_out in (("data.prompts", self.prompts, False),
                                    ("data.eval_prompts", self.eval_prompts, True)):
            try:
                check_spec(spec, held_out=held_out)
            except PromptSetError as e:
                raise ConfigError(f"{key}: {e}") from None

    def held_out_prompts(self) -> str:
        """What data.eval_prompts reads, with "auto" resolved against data.prompts."""
        if self.eval_prompts != "auto":
            return self.eval_prompts
        parsed = parse_spec(self.prompts)
        return f"{parsed[0]}:test" if parsed is not None else "toy-held-out"

