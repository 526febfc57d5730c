"""The single-device training loop (run.mode=local, the reference every distributed mode
is checked against) and held-out evaluation."""
