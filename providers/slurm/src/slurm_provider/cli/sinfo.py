"""``sinfo``: the nodes that are down, drained or failing, and why (a pending job's reason)."""

from __future__ import annotations

from slurm_provider.cli.values import FIELD_SEPARATOR, expand_hostlist, join_argv, output_lines
from slurm_provider.validation import validate_partition

SINFO_FIELDS: tuple[str, ...] = ("NodeList", "StateLong", "Reason")


def build_sinfo_unavailable_nodes(partition: str | None = None) -> str:
    """``sinfo`` listing nodes that are down, drained, draining, failing or not responding,
    one node per line (feeds ``states.classify_pending_reason(down_nodes=...)``)."""
    argv = ["sinfo", "-h", "-N", "--states=down,drain,drained,draining,fail,no_respond"]
    if partition is not None:
        argv.append(f"--partition={validate_partition(partition)}")
    argv.append("--format=" + FIELD_SEPARATOR.join(("%N", "%T", "%E")))
    return join_argv(argv)


def parse_sinfo_unavailable(stdout: str | None) -> dict[str, str]:
    """``node -> state`` from ``slurm_provider.cli.sinfo.build_sinfo_unavailable_nodes`` (``drained``, ``down*`` ...)."""
    nodes: dict[str, str] = {}
    for line in output_lines(stdout):
        node_list, _, rest = line.partition(FIELD_SEPARATOR)
        state = rest.partition(FIELD_SEPARATOR)[0].strip()
        for node in expand_hostlist(node_list):
            nodes[node] = state
    return nodes
