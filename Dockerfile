# One image for every longrun process; each compose service / Deployment picks its command.
FROM python:3.11-slim

# No .pyc writes at runtime (the root filesystem is read-only in Kubernetes), unbuffered logs,
# and the probe port the HEALTHCHECK below and the Kubernetes probes expect.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LONGRUN_HEALTH_PORT=8081

# Numeric uid/gid: Kubernetes can only verify runAsNonRoot against a numeric USER.
# /data is the only writable place besides /tmp: artifacts (/data/artifacts) and the demo
# forge's SQLite file; Docker copies this ownership into a fresh named volume mounted there.
RUN groupadd --system --gid 10001 longrun \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin longrun \
 && install -d -o 10001 -g 10001 /data /data/artifacts

# Exactly what the pyproject.toml files need to build: metadata, readmes, and the package roots.
# The client (the bus contract the core depends on by name) is installed first, the example agent
# last (its run kind and webhook provider reach every service by entry points; an image of your own
# installs your run kinds' packages instead).
WORKDIR /build
COPY clients/python/ clients/python/
COPY pyproject.toml README.md LICENSE ./
COPY shared/ shared/
COPY services/ services/
COPY examples/dependency_upgrade/ examples/dependency_upgrade/
# Runtime dependencies only (no [dev] extras; the s3 extra, so one image stores artifacts on a
# volume or in a bucket); the sources are not needed once installed.
RUN pip install --no-cache-dir ./clients/python && pip install --no-cache-dir ".[s3]" \
 && pip install --no-cache-dir ./examples/dependency_upgrade && rm -rf /build

WORKDIR /data
USER 10001:10001

# Kubernetes sends SIGTERM too; services stop consuming, finish the step in hand, then exit.
STOPSIGNAL SIGTERM
# Liveness only (event loop alive); slim has no curl. Kubernetes ignores this and uses its own probes.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8081/healthz', timeout=2)"]

# No default service: every compose service / Deployment sets its own command.
CMD ["python", "-c", "raise SystemExit('longrun image: run one of\\n  python -m services.{scheduler,worker,timer,reconciler,outbox_relay,gateway}\\n  python -m longrun.db.migrate upgrade\\n  python -m longrun_dependency_upgrade.forge --host 0.0.0.0 --port 8090')"]
