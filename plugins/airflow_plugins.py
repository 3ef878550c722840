"""The project's Airflow plugin registrations: the one file Airflow's plugin loader imports here."""

from hpc_view.plugin import HpcViewPlugin
from slurm_provider.plugin import SlurmProviderPlugin

__all__ = ["HpcViewPlugin", "SlurmProviderPlugin"]
