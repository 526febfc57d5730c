"""DigenRL: disaggregated RL post-training for flow-matching image and video generators.

Layering (imports only point down this list):

    math                      pure torch: schedules, SDE steps, advantages, loss
    models, rewards, toy      policies behind one protocol; (images, prompts) -> rewards
    rollout, learner          single-device sampling and single-device loss/grad
    trainer                   the single-device Flow-GRPO loop
    sched, sim, runtime       the scheduler, its virtual clock, and the Ray runtime
    cli
"""

__version__ = "0.1.0"
