"""Sentinel-1/2 time series for cloud removal: synthetic data, the raw SEN12MS-CR-TS layout, the prepared
training format, datasets, loaders and the cloud curriculum.

The package is named ``vcloud.data``: deploy code with anchored rsync excludes (``--exclude '/data'``),
an unanchored ``--exclude 'data'`` silently drops this package on the cluster.
"""
