# The relay as a container image, and an image of the example services.
#
#   docker build -t outbox-relay .
#   docker run --rm -e RELAY_DATABASE_URL=postgresql://app:secret@db:5432/shop \
#       -e RELAY_SINK=kafka://kafka:9092 -p 9100:9100 outbox-relay
#
# The entry point is the `outbox-relay` command, so `docker run IMAGE migrate`,
# `... status --json` or `... dead` work as they do on a workstation. The
# default command is `run`. The relay image holds the installed packages only;
# `docker build --target examples -t outbox-relay-examples .` adds examples/ for
# the example shop and consumer that compose/docker-compose.yml runs
# (`python -m examples.services shop|consumer`).
FROM python:3.11-slim-bookworm AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# psycopg[binary] and confluent-kafka ship manylinux wheels with libpq and
# librdkafka inside, and the MySQL drivers (the `mysql` extra: asyncmy, PyMySQL,
# cryptography) wheels too, so the slim base needs no compiler and no system
# packages. The image relays from PostgreSQL or MySQL.
COPY pyproject.toml README.md /src/
COPY relay /src/relay
COPY producers /src/producers
COPY consumers /src/consumers
RUN pip install '/src[mysql]' && rm -rf /src

RUN groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin relay
WORKDIR /tmp
# Numeric, so that orchestrators can verify runAsNonRoot without a passwd lookup.
USER 10001:10001

# The example services: the relay's packages, and examples/ beside them.
FROM base AS examples
COPY examples /opt/outbox-relay/examples
ENV PYTHONPATH=/opt/outbox-relay
ENTRYPOINT ["python", "-m", "examples.services"]
CMD ["shop"]

# The relay, last so that a plain `docker build` makes it.
FROM base AS relay

# In a container the metrics server must listen beyond loopback, and the health
# check below needs it running; both can be overridden at `docker run` time.
ENV RELAY_METRICS_PORT=9100 \
    RELAY_METRICS_HOST=0.0.0.0
EXPOSE 9100

# The slim image has no curl: ask Python. urlopen raises on a non-2xx answer,
# so a 503 from /healthz (the relay loop stalled) marks the container unhealthy.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RELAY_METRICS_PORT', '9100'), timeout=4)" || exit 1

# SIGTERM (docker stop) makes the relay finish or release the batches in hand
# and exit 0; give it longer than --publish-timeout (stop_grace_period in compose).
STOPSIGNAL SIGTERM
ENTRYPOINT ["outbox-relay"]
CMD ["run"]
