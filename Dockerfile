# syntax=docker/dockerfile:1
#
# One image for every rbak role; the pod's command/args choose the role
# (see docker/rbak-entrypoint):
#   operator              -> python -m rbak_operator   (Deployment from charts/rbak)
#   rbak backup|restore   -> the CLI                   (Jobs the operator creates: python -m rbak ...)
#   driver | executor     -> Spark driver / executor   (SparkApplications; "spark" target)
#
# Targets:
#   docker build -t rbak:dev .                        runtime (default): no Java, no Spark
#   docker build -t rbak:dev-spark --target spark .   runtime + pyspark + Debian's headless JRE
# Java and pyspark's jars are most of the Spark image, needed only by Spark pods, so they live
# in a separate target built from the same Dockerfile: backup/restore Jobs and the operator
# pull the small image, SparkApplications use the "-spark" tag.
#
# Base: Debian bookworm's slim image and Debian's own python3 (3.11, the interpreter the
# tests run on) and OpenJDK 17 (the JRE the tests run Spark on). Not trixie: its python3 is
# 3.13, which the pinned wheels and the suite were never run with. rbak lives in a venv at
# /opt/rbak; the venv's python is Debian's /usr/bin/python3, present in every stage.
# CI builds this file unchanged with podman on a debootstrapped bookworm imported as
# debian:bookworm-slim (.ci/image); a published image comes from the real base.
#
# Pins: every Python dependency by requirements/image.txt and requirements/spark.txt
# (checked by tests/ship); the Debian packages named here at the versions below, which are
# bookworm's own and do not move with point releases (what they pull in follows Debian's
# security updates of bookworm).

ARG DEBIAN_SUITE=bookworm
ARG PYTHON3_VERSION=3.11.2-1+b1
ARG GCC_VERSION=4:12.2.0-3
ARG PKGCONF_VERSION=1.8.1-1
# OpenSSL's headers move with bookworm's security updates: when the build says this version
# is gone, take the one `apt-cache policy libssl-dev` names in the base.
ARG LIBSSL_VERSION=3.0.22-1~deb12u2
ARG JRE_VERSION=2:1.17-74

# ---------------------------------------------------------------- build
# Debian's python3 with a C toolchain, for rbak's optional C codec speedup (setup.py) and
# Qpid Proton's C engine (an sdist for Python 3.11; OpenSSL's headers give it TLS); only the
# venv reaches the runtime image.
FROM debian:${DEBIAN_SUITE}-slim AS build
# PIP_CERT (unset by default): a CA bundle for pip where PyPI is reached through a TLS proxy
# (.ci/image mounts the host's bundle and names it here); only the build stages see it.
ARG PIP_CERT
ARG PYTHON3_VERSION
ARG GCC_VERSION
ARG PKGCONF_VERSION
ARG LIBSSL_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3="${PYTHON3_VERSION}" python3-venv="${PYTHON3_VERSION}" python3-dev="${PYTHON3_VERSION}" \
      gcc="${GCC_VERSION}" pkgconf="${PKGCONF_VERSION}" libssl-dev="${LIBSSL_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
# PIP_CONSTRAINT reaches the isolated environments pip builds sdists in (rbak's C speedup,
# Qpid Proton): their build tools are pinned too, not the newest of the day.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/rbak/bin:$PATH \
    PIP_CONSTRAINT="/src/requirements/build.txt /src/requirements/image.txt"
RUN python3 -m venv /opt/rbak
WORKDIR /src
# Dependencies first, from the two files that pin them: this layer (and the Spark packages'
# below) is reused until a pin changes, whatever else changes in the repo.
COPY requirements/build.txt requirements/image.txt requirements/
RUN pip install --no-compile --requirement requirements/image.txt

# The Spark packages beside the venv, in /opt/rbak-spark (the same layout: lib/python3.11/
# site-packages, bin): the spark image copies just them over the runtime image's /opt/rbak,
# not a second copy of the whole venv. spark.txt pins everything they need beyond image.txt.
# pyspark's sdist (no pyproject.toml) goes through pip's legacy `setup.py install` with the
# venv's setuptools, the one Debian's python3-venv bundles (fixed in bookworm): building a
# 456 MB wheel first (--use-pep517) cost a minute more here. Built from the dependencies'
# stage, not rbak's: a change to rbak's code reuses it.
FROM build AS build-spark
ARG PIP_CERT
COPY requirements/spark.txt requirements/
RUN pip install --no-compile --no-deps --prefix /opt/rbak-spark --requirement requirements/spark.txt

# What the spark image adds: the Spark packages without what no rbak job runs (docker/slim-venv).
FROM build-spark AS venv-spark
COPY docker/slim-venv /usr/local/bin/slim-venv
RUN slim-venv --spark /opt/rbak /opt/rbak-spark

# rbak and rbak_operator (pyproject finds both), with the C speedup compiled here.
FROM build AS venv
ARG PIP_CERT
COPY pyproject.toml setup.py README.md ./
COPY rbak/ rbak/
COPY operator/ operator/
RUN pip install --no-compile --no-deps .
# What the images ship: the venv without pip, setuptools, the dependencies' tests and what
# rbak never imports, its bytecode compiled (a read-only root filesystem takes no .pyc files);
# the build fails if any module of rbak does not import afterwards or its C speedup is missing
# (setup.py's extension is optional, so pip would not fail) or Proton lacks TLS. docker/slim-venv.
COPY docker/slim-venv /usr/local/bin/slim-venv
RUN slim-venv /opt/rbak

# ---------------------------------------------------------------- runtime
FROM debian:${DEBIAN_SUITE}-slim AS runtime
ARG PYTHON3_VERSION
LABEL org.opencontainers.image.title="rbak" \
      org.opencontainers.image.description="RabbitMQ backups in the RBAK format: CLI, operator, backup/restore jobs" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.source="https://github.com/rbak/rbak"
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3="${PYTHON3_VERSION}" \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 rbak \
 && useradd --uid 1000 --gid 1000 --no-log-init --create-home --home-dir /home/rbak --shell /usr/sbin/nologin rbak
# Bytecode is compiled at build time: a read-only root filesystem cannot take .pyc files.
# TLS trust without a system store: certifi's pinned bundle (what requests and botocore use)
# is the default for Python's ssl too (an AMQPS broker or a webhook with no ca_cert set).
ENV PATH=/opt/rbak/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SSL_CERT_FILE=/opt/rbak/lib/python3.11/site-packages/certifi/cacert.pem \
    HOME=/home/rbak
COPY --from=venv /opt/rbak /opt/rbak
COPY docker/rbak-entrypoint /usr/local/bin/rbak-entrypoint
WORKDIR /home/rbak
# Numeric UID so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 1000:1000
ENTRYPOINT ["rbak-entrypoint"]
CMD ["rbak", "--help"]

# ---------------------------------------------------------------- spark
FROM runtime AS spark
ARG JRE_VERSION
USER 0:0
# Debian's headless OpenJDK 17 (default-jre-headless in bookworm); /usr/lib/jvm/default-java
# is its arch-independent home. Its postinst links man pages into man1, which slim images
# leave out: without the directory the install fails. Two files of the package no Spark pod
# reads go (20 MB): javac's ct.sym (the compiler's platform signatures) and the class-data
# archive for heaps over 32 GB (classes_nocoops.jsa; a JVM without it starts without that
# cache). Nothing else of Java is touched.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless="${JRE_VERSION}" \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /usr/lib/jvm/default-java/lib/ct.sym /usr/lib/jvm/default-java/lib/server/classes_nocoops.jsa
ENV JAVA_HOME=/usr/lib/jvm/default-java \
    SPARK_HOME=/opt/rbak/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/rbak/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/rbak/bin/python
COPY --from=venv-spark /opt/rbak-spark/ /opt/rbak/
COPY spark/ /opt/rbak/spark/
USER 1000:1000
