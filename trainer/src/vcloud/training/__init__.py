"""The training loop and the pieces it is made of: precision, stop signals (and DataLoader workers
that survive them), distributed setup, resumable sampling, learning-rate schedule, RNG state,
output paths and the progress/completion markers."""
