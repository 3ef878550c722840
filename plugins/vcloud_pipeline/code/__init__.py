"""The code a run's jobs run: the tree and its hash, syncing it to the cluster, and keeping it there."""
