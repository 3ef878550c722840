"""GPU-hours: the worst case of a job, the allocation, the ledger, and the checks before submitting."""
