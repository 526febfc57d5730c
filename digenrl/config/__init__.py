"""The run's configuration, and the contract that turns a validated Config into the
scheduler's config and the pools.

    schema.py    Config, the root of the sections, and the entry points: load_config,
                 with_overrides, dump_config, dotted_get
    model.py     ModelConfig, MODEL_NAMES              (model.*)
    sampling.py  SamplingConfig, SIGMA_GRIDS           (sampling.*)
    data.py      DataConfig                            (data.*)
    reward.py    RewardConfig                          (reward.*)
    train.py     TrainConfig                           (train.*)
    run.py       RunConfig, MODES, LOGGERS             (run.*)
    runtime.py   RuntimeConfig, PoolConfig, SPOT_KEYS  (runtime.*, runtime.<pool>.*)
    rules.py     the checks across sections, which Config runs after each section checked its own keys
    errors.py    ConfigError, and the checks that name a key in their error
    build.py     a mapping made into the dataclasses: types coerced, unknown and RENAMED keys refused
    keys.py      every key with its type, default and description: config_keys, config_help (--help-config)
    contract.py  Config -> the scheduler's config and the pools

A section's __post_init__ checks its own keys; what a model family can do is asked of
digenrl.models.families.
"""
