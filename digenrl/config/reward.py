"""config.reward: which rewards score the samples and how advantages are formed (RewardConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field

from digenrl.config.errors import ConfigError, check, one_of
from digenrl.math.kinds import AGGREGATE_KINDS, STD_KINDS


@dataclass
class RewardConfig:
    """Which rewards score the samples, how they combine, and how advantages are formed."""

    # reward name -> weight; the names are digenrl.rewards.REWARD_NAMES (see docs/guides/rewards.md). Several
    # rewards are combined per sample by reward.aggregate
    weights: dict[str, float] = field(default_factory=lambda: {"toy-geneval": 1.0})
    # sum: the weighted sum of the raw rewards; gdpo: each reward standardised within its prompt
    # group first, then the weighted sum (GDPO, arXiv 2601.05242); its batch normalisation is
    # reward.adv_std=global (none where the mode streams), so gdpo refuses adv_std=group
    aggregate: str = "sum"
    paths: dict[str, str] = field(default_factory=dict)  # reward name -> local model folder or server URL
    threads: int = 2  # reward computation overlaps generation in a thread pool
    # advantage = (reward - group mean) / std, the std of the prompt group, of the whole RL
    # step (global), or none (Dr.GRPO: no division)
    adv_std: str = "group"
    adv_clip: float = 5.0  # advantages are clipped to [-adv_clip, adv_clip]

    def __post_init__(self) -> None:
        from digenrl.rewards import REWARD_NAMES

        check(bool(self.weights), "reward.weights", "name at least one reward")
        for name in self.weights:
            one_of(name, f"reward.weights.{name}", REWARD_NAMES)
        if "remote" in self.paths:
            url, _, served = self.paths["remote"].partition("#")
            check(url.startswith(("http://", "https://")) and bool(served), "reward.paths.remote",
                  f"{self.paths['remote']!r} is not <http(s)://host:port>#<served reward name>, "
                  "e.g. http://10.0.0.5:8000#pickscore")
            from digenrl.rewards import AUDIO_REWARDS, SOURCE_REWARDS

            check(served not in AUDIO_REWARDS + SOURCE_REWARDS, "reward.paths.remote",
                  f"#{served} scores the generated audio or each sample's source image, which a reward "
                  f"server's requests do not carry (images and prompts only): use reward.weights.{served}")
        for name in self.weights:  # keys a model reward does not take fail here, not on a worker
            if name in self.paths:
                from digenrl.rewards.registry_models import check_args as check_reward_args  # torch

                try:
                    check_reward_args(name, self.paths[name])
                except ValueError as e:
                    raise ConfigError(f"reward.paths.{name}: {e}") from None
        one_of(self.aggregate, "reward.aggregate", AGGREGATE_KINDS)
        one_of(self.adv_std, "reward.adv_std", STD_KINDS)
        check(self.aggregate != "gdpo" or self.adv_std != "group", "reward.adv_std",
              "group re-standardises each group's GDPO sum, which collapses distinct reward combinations "
              "into one advantage again (what GDPO removes); use global (GDPO's batch normalisation) or none "
              "(the GDPO sum as the advantage, for modes that stream)")
        check(self.threads >= 1, "reward.threads", "must be >= 1")

