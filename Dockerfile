# syntax=docker/dockerfile:1
#
# One image for every rbak role; the pod's command/args choose the role
# (see docker/rbak-entrypoint):
#   operator              -> python -m rbak_operator   (Deployment from charts/rbak)
#   rbak backup|restore   -> the CLI                   (Jobs the operator creates)
#   driver | executor     -> Spark driver / executor   (SparkApplications; "spark" target)
#
# Targets:
#   docker build -t rbak:dev .                        runtime (default): no Java, no Spark
#   docker build -t rbak:dev-spark --target spark .   runtime + pyspark + a Java 17 JRE
# Java and pyspark's jars are ~600 MB, needed only by Spark pods, so they live in a
# separate target built from the same Dockerfile: backup/restore Jobs and the
# operator pull the small image, SparkApplications use the "-spark" tag.
#
# Pins: the Python base is an exact patch tag (the interpreter the tests run on),
# the JRE is an exact Temurin tag copied in (no apt, nothing floating), and every
# Python dependency is pinned by requirements/image.txt (checked by tests/ship).

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm
# Same interpreter and Debian release with a C toolchain, for rbak's optional C
# codec speedup (setup.py); only the built files reach the runtime image.
ARG BUILD_IMAGE=python:3.11.7-bookworm
ARG JRE_IMAGE=eclipse-temurin:17.0.13_11-jre-jammy

# ---------------------------------------------------------------- build
FROM ${BUILD_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/ requirements/
# Dependencies first: this layer is reused while only rbak's own code changes.
RUN pip install --prefix=/install --no-compile --requirement requirements/image.txt
COPY pyproject.toml setup.py README.md ./
COPY rbak/ rbak/
COPY operator/rbak_operator/ operator/rbak_operator/
# rbak and rbak_operator (pyproject finds both), with the C speedup compiled here.
RUN pip install --prefix=/install --no-compile --no-deps . \
 && python -I -c "import sys; sys.path.insert(0, '/install/lib/python3.11/site-packages'); import rbak.format._speedups"

FROM build AS build-spark
RUN pip install --prefix=/install --no-compile --requirement requirements/spark.txt

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="rbak" \
      org.opencontainers.image.description="RabbitMQ backups in the RBAK format: CLI, operator, backup/restore jobs" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.source="https://github.com/rbak/rbak"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/rbak
RUN groupadd --gid 1000 rbak \
 && useradd --uid 1000 --gid 1000 --no-log-init --create-home --home-dir /home/rbak --shell /usr/sbin/nologin rbak
COPY --from=build /install /usr/local
COPY docker/rbak-entrypoint /usr/local/bin/rbak-entrypoint
WORKDIR /home/rbak
# Numeric UID so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 1000:1000
ENTRYPOINT ["rbak-entrypoint"]
CMD ["rbak", "--help"]

# ---------------------------------------------------------------- spark
FROM ${JRE_IMAGE} AS jre

FROM runtime AS spark
ENV JAVA_HOME=/opt/java/openjdk \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=python3 \
    PYSPARK_DRIVER_PYTHON=python3
ENV PATH="${JAVA_HOME}/bin:${PATH}"
COPY --from=jre /opt/java/openjdk /opt/java/openjdk
COPY --from=build-spark /install /usr/local
COPY spark/ /opt/rbak/spark/
