# The Airflow image of the vcloud deployment: the official image plus the project's pinned
# Python requirements (requirements-lock.txt), installed at build time, never at container start.
# Project code (dags/, plugins/, include/, trainer/) is mounted by docker-compose.yaml; the Slurm
# provider (providers/slurm) is installed into the image as a distribution. SSH
# keys are mounted read-only at run time: neither is part of the image.
#
#   docker-compose build        (context: the repository root)
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_IMAGE}

USER root
# The openssh transport and the code sync run the system ssh and rsync clients.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client rsync \
    && apt-get clean && rm -rf /var/lib/apt/lists/*

USER airflow
COPY --chown=airflow:root requirements-lock.txt /opt/vcloud/requirements-lock.txt
# torch is pinned without a local version; the CPU index keeps the image free of CUDA wheels
# (the Airflow side never trains; the lock's CPU torch is the tested set).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" \
        "apache-airflow==3.3.2" -r /opt/vcloud/requirements-lock.txt \
    && python -c "import airflow, airflow.providers.ssh, airflow.providers.celery, celery, redis, psycopg2, asyncpg, asyncssh, paramiko, yaml, rasterio, tifffile"
# The Slurm provider distribution (its dependencies are in the lock); Airflow finds its hooks, the
# slurm connection type and the extra link through its entry point. Rebuild the image after changing it.
COPY --chown=airflow:root providers/slurm /opt/vcloud/providers/slurm
RUN pip install --no-cache-dir "apache-airflow==3.3.2" /opt/vcloud/providers/slurm \
    && python -c "import slurm_provider.operators, slurm_provider.triggers"
