"""DigenRL: disaggregated RL post-training for flow-matching image and video generators.

Layers (a part imports only the parts of rows above its own; tests/test_layering.py holds it):

    math, sched, prompt_sets  pure torch math; the scheduler state machine; prompt lists
    models                    policies behind one protocol
    rollout, toy              single-device sampling; the toy world
    learner, data, rewards    single-device loss/grad; prompt sources; (images, prompts) -> rewards
    config                    the run's schema and its contract with the scheduler
    io                        checkpoints, recorder, trace, outputs: what a run writes and reads
    train                     the single-device Flow-GRPO loop, the reference
    sim                       the scheduler on a virtual clock, the cost model, the planner
    profile                   per-unit costs measured on this machine
    runtime                   the scheduler on Ray
    tools                     the commands
"""

__version__ = "0.1.0"
