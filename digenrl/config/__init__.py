"""The run's schema (schema.py: every key, its default, its description, the checks across
sections) and the contract that turns a validated Config into the scheduler's config
and the pools (contract.py)."""
