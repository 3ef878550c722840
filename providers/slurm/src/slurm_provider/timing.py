"""How often a watched job is polled: the one set of defaults the operator, sensor, triggers and the
login wait share (a deployment may pass its own, e.g. a few seconds on a local test cluster)."""

from __future__ import annotations

POLL_INTERVAL = 15.0
"""Seconds between the first status polls; the interval grows after every poll with no change."""
MAX_POLL_INTERVAL = 300.0
"""The longest interval between two polls."""
FIRST_POLL_DELAY = 10.0
"""Seconds before the first poll of a job just submitted (Slurm needs a moment to list it)."""
