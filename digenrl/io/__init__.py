"""What a run writes and reads back: checkpoints, the recorder (metrics, samples, the trace),
output files and media, loggers, a run directory read back."""
