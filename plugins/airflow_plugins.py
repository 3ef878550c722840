"""The project's Airflow plugin registrations: the one file Airflow's plugin loader imports here."""

from slurm_provider.plugin import SlurmProviderPlugin

__all__ = ["SlurmProviderPlugin"]
