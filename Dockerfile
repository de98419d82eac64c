# The cowrite daemon image: `cowrite daemon` with the S3 and ZooKeeper extras, no Spark.
# Built from the repository root:  docker build -t cowrite:0.1.0 .
# The Helm chart in helm/cowrite-daemon runs it as UID 10001 with a read-only root filesystem and an
# emptyDir at /tmp, the only place the daemon writes.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the build needs: .dockerignore admits nothing else into the context.
COPY pyproject.toml README.md ./
COPY cowrite ./cowrite
# A virtualenv, so the runtime stage copies one directory and no build leftovers.
RUN python -m venv /opt/cowrite \
 && /opt/cowrite/bin/pip install ".[s3,zookeeper]"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="cowrite-daemon" \
      org.opencontainers.image.description="Multi-writer Apache Hudi table daemon: lock expiry, rollback, cleaning, metrics" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric UID/GID, so runAsNonRoot can be checked by the kubelet and matches the chart.
RUN groupadd --system --gid 10001 cowrite \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin cowrite
COPY --from=build /opt/cowrite /opt/cowrite
# No .pyc writes: the root filesystem is read-only at run time. HOME=/tmp for libraries that cache there.
ENV PATH=/opt/cowrite/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
EXPOSE 9464
# The daemon drains on SIGTERM (Docker's default stop signal; stated for clarity).
STOPSIGNAL SIGTERM
ENTRYPOINT ["cowrite"]
CMD ["daemon", "--config", "/etc/cowrite/daemon.toml"]
