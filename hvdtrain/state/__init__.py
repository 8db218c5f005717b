"""What outlives a process: checkpoints, resume, the output folder's ownership and safe
writes."""
