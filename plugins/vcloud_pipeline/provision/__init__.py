"""The job environment: what the site's container lacks of the trainer's runtime requirements,
installed once per requirement set and site image into a directory of its own (``paths.pylibs/<key>``)."""
