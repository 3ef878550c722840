"""The project's Airflow plugin registrations: the one file Airflow's plugin loader imports here.

The Slurm provider (``providers/slurm``) is a distribution of its own: Airflow finds its hooks,
connection type and extra link through its ``apache_airflow_provider`` entry point.
"""

from hpc_view.plugin import HpcViewPlugin

__all__ = ["HpcViewPlugin"]
