"""Registers the Slurm integration's operator extra link with Airflow."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from slurm_provider.links import SlurmJobLogLink


class SlurmProviderPlugin(AirflowPlugin):
    name = "slurm_provider"
    operator_extra_links = [SlurmJobLogLink()]
