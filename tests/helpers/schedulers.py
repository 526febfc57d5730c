"""Small schedulers the runtime tests drive (emulated compute, the event loop's watchdog)."""

from digenrl.sched import Scheduler, SchedConfig, Worker


def small_digenrl_scheduler() -> Scheduler:
    """digenrl mode with TCSS (opt-in), 3 RL steps of 4 groups x 2 samples, 2 denoising steps;
    rollout r0, r1, trainer t0."""
    workers = [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")]
    return Scheduler(SchedConfig(mode="digenrl", tcss=True, rl_steps=3, groups_per_step=4, samples_per_group=2,
                                 num_steps=2),
                     workers)
