"""How a step's learner metrics fold over units, gang ranks and trainers."""

from __future__ import annotations

# Metric families a step reports (metrics.jsonl, TensorBoard, wandb). A key ending in _max
# combines by max over units, ranks and trainers; the others by the step's weighted mean.
STEP_METRICS = ("loss/", "consistency/")


def add_metric(sums: dict[str, float], key: str, value: float, weight: float) -> None:
    """Fold one unit's metric into a step's sums: weighted sum, or max for a _max key."""
    if key.endswith("_max"):
        sums[key] = max(sums.get(key, -float("inf")), value)
    else:
        sums[key] = sums.get(key, 0.0) + value * weight


def merge_sums(parts: list[dict[str, float]]) -> dict[str, float]:
    """Several learners' (or ranks') metric sums as one: added, or max for a _max key."""
    total: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            add_metric(total, k, v, 1.0)
    return total


def step_means(sums: dict[str, float], weight: float) -> dict[str, float]:
    """The step's metrics from its sums: weighted means, maxima as they are."""
    w = weight or 1.0
    return {k: v if k.endswith("_max") else v / w for k, v in sums.items() if k.startswith(STEP_METRICS)}
