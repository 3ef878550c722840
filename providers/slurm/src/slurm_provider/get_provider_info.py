"""What Airflow's providers manager learns about this distribution (entry point ``apache_airflow_provider``).

Kept free of Airflow imports: every Airflow process reads it when it discovers providers.
"""

from __future__ import annotations

from typing import Any

from slurm_provider.connection_form import provider_connection_type

PACKAGE_NAME = "airflow-provider-slurm-ssh"
VERSION = "0.1.0"
INTEGRATION = "Slurm"


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata in the shape of Airflow's ``provider_info.schema.json``."""
    return {
        "package-name": PACKAGE_NAME,
        "name": "Slurm",
        "description": "Submit batch scripts to Slurm clusters over SSH and wait for them in the "
                       "triggerer: no duplicate jobs, exactly one final event per wait.\n",
        "versions": [VERSION],
        "integrations": [{"integration-name": INTEGRATION, "external-doc-url": "https://slurm.schedmd.com/",
                          "tags": ["software"]}],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": ["slurm_provider.hooks"]}],
        "operators": [{"integration-name": INTEGRATION, "python-modules": ["slurm_provider.operators"]}],
        "sensors": [{"integration-name": INTEGRATION, "python-modules": ["slurm_provider.sensors"]}],
        "triggers": [{"integration-name": INTEGRATION,
                      "python-modules": ["slurm_provider.triggers", "slurm_provider.login_wait"]}],
        "extra-links": ["slurm_provider.links.SlurmJobLogLink"],
        "connection-types": [provider_connection_type()],
        "config": {
            "slurm": {
                "description": "Settings of the Slurm provider.",
                "options": {
                    "job_view_path": {
                        "description": "Path under the API server's base URL of a page that shows a "
                                       "task's Slurm jobs (called with dag_id, run_id and task_id, anchor "
                                       "#job-<id>); the operator's extra link opens it. Empty: the link "
                                       "opens the task's log, which carries the job's output.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/slurm-jobs/",
                        "default": "",
                    },
                },
            },
        },
    }
