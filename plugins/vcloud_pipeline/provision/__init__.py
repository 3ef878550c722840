"""The job environment: what the site's container lacks of the trainer's runtime requirements,
installed once per requirement set into a directory of its own (``paths.pylibs/<hash>``)."""
