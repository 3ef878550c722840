"""vcloud: multi-temporal satellite cloud removal (data, models, resumable training, export)."""

__version__ = "0.1.0"
