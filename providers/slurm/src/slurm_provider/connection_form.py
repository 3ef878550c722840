"""The ``slurm`` connection type's form: its extra fields and how the standard fields read.

Pure data, so Airflow reads it from :func:`slurm_provider.get_provider_info.get_provider_info`
(``conn-fields``, ``ui-field-behaviour``) without importing the hook, and the hook's
``get_connection_form_widgets`` / ``get_ui_field_behaviour`` build the same form for Airflow
versions that still ask the hook. Every field is stored under its own name in the connection's
extras, which is where :mod:`slurm_provider.transport` reads it.
"""

from __future__ import annotations

from typing import Any

CONN_TYPE = "slurm"
HOOK_NAME = "Slurm"
HOOK_CLASS = "slurm_provider.hooks.SlurmHook"

CONNECTION_FIELDS: dict[str, dict[str, Any]] = {
    "transport": {
        "label": "Transport",
        "description": (
            "paramiko: Airflow's SSH provider logs in with the key or password below. openssh: the "
            "system ssh client with the ssh_config alias below, reusing its ControlMaster socket "
            "(for logins that need a one-time password: open the master once with 'ssh <alias>')."
        ),
        "schema": {"type": ["string", "null"], "enum": ["paramiko", "openssh"], "default": "paramiko"},
    },
    "host_key": {
        "label": "Pinned host key",
        "description": "The login node's public host key, '<type> <base64>' (ssh-keyscan it and check the "
                       "fingerprint with the site); any other key is refused.",
        "schema": {"type": ["string", "null"]},
    },
    "key_file": {
        "label": "Private key file",
        "description": "Path of the private key on the Airflow workers and triggerers (paramiko transport).",
        "schema": {"type": ["string", "null"]},
    },
    "private_key": {
        "label": "Private key",
        "description": "The private key itself (PEM or OpenSSH format); wins over the key file.",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "private_key_passphrase": {
        "label": "Private key passphrase",
        "description": "Passphrase of the private key, if it has one.",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "ssh_alias": {
        "label": "ssh_config alias (openssh)",
        "description": "Host alias in the ssh config (openssh transport); the config decides host name, "
                       "user, key and ControlMaster. Empty: the Host field.",
        "schema": {"type": ["string", "null"]},
    },
    "ssh_config_file": {
        "label": "ssh_config file (openssh)",
        "description": "The ssh config file the alias is read from (openssh transport); empty: ~/.ssh/config.",
        "schema": {"type": ["string", "null"]},
    },
    "require_control_master": {
        "label": "Require a running ControlMaster (openssh)",
        "description": "Never log in without the alias's ControlMaster; say how to open it instead.",
        "schema": {"type": ["boolean", "null"], "default": False},
    },
    "min_call_interval": {
        "label": "Least seconds between Slurm calls",
        "description": "The site's limit on scheduler calls (squeue, sacct, scontrol, sshare, sbatch): the "
                       "job watches of this connection keep at least this many seconds between two calls, "
                       "whatever the number of jobs watched (15 where a site allows four a minute). Empty: "
                       "no limit beyond the poll schedule.",
        "schema": {"type": ["number", "null"]},
    },
}
"""Extra fields of the form, in the ``conn-fields`` shape of Airflow's provider info."""

HIDDEN_FIELDS: list[str] = ["schema"]
RELABELING: dict[str, str] = {
    "host": "Login node",
    "login": "Username",
    "password": "Password (only without a key)",
}
PLACEHOLDERS: dict[str, str] = {
    "host": "login.cluster.example.org",
    "port": "22",
    "login": "your cluster user name",
    "host_key": "ssh-ed25519 AAAAC3Nza...",
    "key_file": "/opt/airflow/secrets/ssh/id_ed25519",
    "ssh_alias": "cluster-login",
    "ssh_config_file": "/opt/airflow/secrets/ssh/config",
}


def ui_field_behaviour() -> dict[str, Any]:
    """Hidden, relabelled and placeholder fields, as a hook's ``get_ui_field_behaviour`` returns them."""
    return {"hidden_fields": list(HIDDEN_FIELDS), "relabeling": dict(RELABELING),
            "placeholders": dict(PLACEHOLDERS)}


def provider_connection_type() -> dict[str, Any]:
    """The ``connection-types`` entry of the provider info (kebab-case keys, Airflow's schema)."""
    return {
        "hook-class-name": HOOK_CLASS,
        "hook-name": HOOK_NAME,
        "connection-type": CONN_TYPE,
        "conn-fields": {name: {**field, "schema": dict(field["schema"])} for name, field in CONNECTION_FIELDS.items()},
        "ui-field-behaviour": {
            "hidden-fields": list(HIDDEN_FIELDS),
            "relabeling": dict(RELABELING),
            "placeholders": dict(PLACEHOLDERS),
        },
    }
