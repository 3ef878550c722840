"""Run one command on a cluster's login node and hand back what it printed.

Transports never interpret Slurm; :mod:`slurm_provider.hooks` does. Pick one per Airflow
connection with :func:`runner_for_connection` / :func:`async_runner_for_connection`; tools that
start ``ssh`` themselves (rsync) get the same login from :func:`ssh_command_for_connection`.
"""

from slurm_provider.transport.base import (
    NO_EXIT_STATUS,
    AsyncRemoteCommandRunner,
    AuthenticationFailed,
    CommandResult,
    ControlMasterNotRunning,
    HostKeyRejected,
    RemoteCommandRunner,
    TransportConfigError,
    TransportError,
    TransportTimeout,
    TransportUnavailable,
)
from slurm_provider.transport.factory import (
    OPENSSH,
    PARAMIKO,
    TRANSPORTS,
    AsyncConnectionRunner,
    async_runner_for_connection,
    runner_for_connection,
    transport_name,
)
from slurm_provider.transport.openssh import OpenSSHTarget
from slurm_provider.transport.openssh_runners import AsyncOpenSSHRunner, OpenSSHRunner
from slurm_provider.transport.ssh_command import (
    KeyLogin,
    SSHCommand,
    person_login_argv,
    remote_user_for_connection,
    ssh_command_for_connection,
)
from slurm_provider.transport.ssh_provider import AsyncSSHProviderRunner, SSHProviderRunner

__all__ = [
    "NO_EXIT_STATUS",
    "OPENSSH",
    "PARAMIKO",
    "TRANSPORTS",
    "AsyncConnectionRunner",
    "AsyncOpenSSHRunner",
    "AsyncRemoteCommandRunner",
    "AsyncSSHProviderRunner",
    "AuthenticationFailed",
    "CommandResult",
    "ControlMasterNotRunning",
    "HostKeyRejected",
    "KeyLogin",
    "OpenSSHRunner",
    "OpenSSHTarget",
    "RemoteCommandRunner",
    "SSHCommand",
    "SSHProviderRunner",
    "TransportConfigError",
    "TransportError",
    "TransportTimeout",
    "TransportUnavailable",
    "async_runner_for_connection",
    "person_login_argv",
    "remote_user_for_connection",
    "runner_for_connection",
    "ssh_command_for_connection",
    "transport_name",
]
