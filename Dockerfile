# syntax=docker/dockerfile:1
# Three stages (docs/deployment.md, "Images"):
#   builder  builds our wheels; nothing of it ships.
#   runtime  the production image (ghcr.io/longrun/longrun): the runtime and the client on the locked
#            dependencies, every service and the migration; no example code, no demo forge.
#   example  runtime plus the example agent (its run kind, webhook provider and demo forge), which
#            docker-compose.yml runs (ghcr.io/longrun/longrun-example).
# An image of your own is built like example: FROM the runtime image, your run kinds' wheels
# installed --no-deps into /opt/longrun (their longrun.run_kinds entry points register them).

# An exact release: a rebuild gets the same interpreter until this line changes.
FROM python:3.11.14-slim-bookworm AS base
# No .pyc writes at runtime (the root filesystem is read-only in Kubernetes), unbuffered logs.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

FROM base AS builder
# Exactly what the pyproject.toml files need to build: metadata, readmes, licences, package roots.
WORKDIR /build
COPY infra/image/ infra/image/
COPY pyproject.toml setup.py README.md LICENSE ./
COPY shared/ shared/
COPY services/ services/
COPY clients/python/ clients/python/
COPY examples/dependency_upgrade/ examples/dependency_upgrade/
RUN sh infra/image/build-wheels.sh /wheels/runtime . clients/python \
 && sh infra/image/build-wheels.sh /wheels/example examples/dependency_upgrade

FROM base AS runtime
# Numeric uid/gid: Kubernetes can only verify runAsNonRoot against a numeric USER.
# /data is the only writable place besides /tmp: artifacts (/data/artifacts) and the demo
# forge's SQLite file; Docker copies this ownership into a fresh named volume mounted there.
RUN groupadd --system --gid 10001 longrun \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin longrun \
 && install -d -o 10001 -g 10001 /data /data/artifacts
# The lock, then our wheels without dependencies, by the script the image test runs too
# (tests/integration/test_image_install.py); the lock, script and wheels are mounted, not kept.
RUN --mount=type=bind,source=requirements/runtime.txt,target=/tmp/install/runtime.txt \
    --mount=type=bind,source=infra/image/install.sh,target=/tmp/install/install.sh \
    --mount=type=bind,from=builder,source=/wheels/runtime,target=/tmp/install/wheels \
    sh /tmp/install/install.sh /opt/longrun /tmp/install/runtime.txt /tmp/install/wheels
# The services' console scripts and `python` are the environment's.
ENV PATH=/opt/longrun/bin:$PATH \
    LONGRUN_HEALTH_PORT=8081

WORKDIR /data
USER 10001:10001

# Kubernetes sends SIGTERM too; services stop consuming, finish the step in hand, then exit.
STOPSIGNAL SIGTERM
# Liveness only (event loop alive); slim has no curl. Kubernetes ignores this and uses its own probes.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8081/healthz', timeout=2)"]

# No default service: every compose service / Deployment sets its own command.
CMD ["python", "-c", "raise SystemExit('longrun image: run one of\\n  longrun-{scheduler,worker,timer,reconciler,outbox-relay,gateway}\\n  python -m longrun.db.migrate upgrade')"]

FROM runtime AS example
# Installing into the root-owned environment needs root; the image runs as 10001 again below.
# The example's own dependencies (dulwich, for the demo forge's git repositories) from their hashed
# lock, resolved within runtime.txt so nothing already installed moves; then the example wheel alone.
USER 0:0
RUN --mount=type=bind,source=requirements/example.txt,target=/tmp/install/example.txt \
    --mount=type=bind,from=builder,source=/wheels/example,target=/tmp/install/wheels \
    python -m pip install --quiet --no-cache-dir --require-hashes --only-binary=:all: -r /tmp/install/example.txt \
 && python -m pip install --quiet --no-cache-dir --no-deps --no-index /tmp/install/wheels/*.whl \
 && python -m pip check
USER 10001:10001
CMD ["python", "-c", "raise SystemExit('longrun example image: run one of\\n  longrun-{scheduler,worker,timer,reconciler,outbox-relay,gateway}\\n  python -m longrun.db.migrate upgrade\\n  python -m longrun_dependency_upgrade.forge --host 0.0.0.0 --port 8090')"]
