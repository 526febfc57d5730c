"""Commands: the CLI, benchmarks of every mode side by side, post-hoc sample evaluation,
and the preflight check of a run's inputs."""
