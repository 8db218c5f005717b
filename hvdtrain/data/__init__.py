"""What a rank trains on: datasets, the sampler that splits them over workers with equal
steps per rank, and the loaders that turn samples into batches off the training thread.
Knows nothing of the store or the job."""
