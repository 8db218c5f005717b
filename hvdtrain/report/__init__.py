"""What people and tools read of a run: rank-aware logging, ``metrics.jsonl``, the progress
bar, TensorBoard scalars, the summary and ``hvdtrain-plot``."""
