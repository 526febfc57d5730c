"""A pool of Ray actors, each holding one copy of a reward, scoring batches concurrently.

    driver: pool.score_async(images, prompts) -> ObjectRef[(B,) float32]
              |  least-loaded actor (fewest unfinished calls; ties round-robin)
    actors: [RewardActor 0] [RewardActor 1] ... each builds its reward once, in its own process

Fault tolerance is Ray's: a dead actor is restarted (max_restarts) and the calls it was
running are re-run (max_task_retries; scoring is idempotent, so re-running is safe). The
blocking `pool(images, prompts)` additionally drops an actor that is gone for good and resubmits
to a live one. The pool is itself a Reward, so rollout code can hold it like any other.
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence, Union

import ray
import torch

from digenrl.rewards.base import Reward, check_media

# What each actor builds its reward from: a spec string (see digenrl.rewards.server.resolve_reward),
# a zero-argument factory or Reward class (built inside the actor: heavy models load there, not in the driver),
# or a Reward instance (shipped to the actor by Ray's serializer).
RewardSource = Union[str, Callable[[], Reward], Reward]


class RewardActor:
    """Holds one reward in a Ray worker process."""

    def __init__(self, source: RewardSource):
        torch.set_num_threads(max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))))
        if isinstance(source, str):
            from digenrl.rewards.server import resolve_reward

            self.reward = resolve_reward(source)
        elif isinstance(source, type) or not isinstance(getattr(source, "name", None), str):
            self.reward = source()  # a Reward class or a factory function
        else:
            self.reward = source  # a Reward instance

    def name(self) -> str:
        return self.reward.name

    @torch.no_grad()
    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return torch.as_tensor(self.reward(images, list(prompts))).float().cpu()


class RewardPool:
    """N Ray actors scoring with the same reward. Needs `ray.init()` first.

    Blocks in the constructor until every actor has built its reward, so a reward that fails
    to load fails here, with its own error.
    """

    def __init__(
        self,
        source: RewardSource,
        num_workers: int = 1,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        max_restarts: int = 3,
        max_task_retries: int = 3,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        actor_cls = ray.remote(RewardActor).options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts, max_task_retries=max_task_retries
        )
        self.actors = [actor_cls.remote(source) for _ in range(num_workers)]
        names = ray.get([a.name.remote() for a in self.actors])
        self.name: str = names[0]
        self._inflight: list[list[ray.ObjectRef]] = [[] for _ in self.actors]
        self._turn = itertools.count()
        self._dead: set[int] = set()  # actors that died after exhausting max_restarts

    def _pick(self) -> int:
        """Index of the live actor with the fewest unfinished calls; ties broken round-robin."""
        for refs in self._inflight:
            if refs:
                _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
                refs[:] = pending
        live = [i for i in range(len(self.actors)) if i not in self._dead]
        if not live:
            raise RuntimeError(f"reward pool {self.name!r}: every actor died and exhausted its restarts")
        start = next(self._turn)
        return min(live, key=lambda i: (len(self._inflight[i]), (i - start) % len(self.actors)))

    def _submit(self, images: torch.Tensor, prompts: Sequence[str]) -> tuple[int, ray.ObjectRef]:
        check_media(images, prompts)
        i = self._pick()
        ref = self.actors[i].score.remote(images, list(prompts))
        self._inflight[i].append(ref)
        return i, ref

    def score_async(self, images: torch.Tensor, prompts: Sequence[str]) -> ray.ObjectRef:
        """Submit a batch to the least-loaded actor; the ref resolves to (B,) float32 CPU scores."""
        return self._submit(images, prompts)[1]

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """Blocking score; an actor gone for good is dropped and the batch resubmitted to another."""
        for _ in range(3 * len(self.actors)):
            i, ref = self._submit(images, prompts)
            try:
                return ray.get(ref)
            except ray.exceptions.ActorDiedError:  # restarts exhausted: never use it again
                self._dead.add(i)
                self._inflight[i].clear()
            except ray.exceptions.RayActorError:  # transiently unreachable: try again, maybe elsewhere
                continue
        tries = 3 * len(self.actors)
        raise RuntimeError(f"reward pool {self.name!r}: no actor could score the batch after {tries} tries")

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors, self._inflight = [], []

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
