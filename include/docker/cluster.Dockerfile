# The dev-cluster: the local Slurm cluster (slurmctld, six namespaced slurmd nodes, slurmdbd, MariaDB, munge) with an SSH
# login node, brought up by the same include/local_cluster/cluster.sh that `make cluster-up` runs.
# Keys, the munge key and the database are created when the container starts, in volumes.
#
#   docker-compose --profile dev-cluster up      (context: the repository root)
FROM debian:12

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates procps \
    && apt-get clean && rm -rf /var/lib/apt/lists/*

COPY include/local_cluster /opt/vcloud/include/local_cluster
COPY trainer/requirements-runtime.txt /opt/vcloud/trainer/requirements-runtime.txt
# Slurm, MariaDB, sshd and the jobs' Python environment (/opt/vcloud-localcluster/venv), baked in
# so that `up` at container start only configures and starts daemons. CPU torch for the jobs.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL}" bash /opt/vcloud/include/local_cluster/cluster.sh install \
    && apt-get clean && rm -rf /var/lib/apt/lists/*

COPY include/docker/cluster-entrypoint.sh /usr/local/bin/cluster-entrypoint.sh
EXPOSE 2222
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/cluster-entrypoint.sh"]
