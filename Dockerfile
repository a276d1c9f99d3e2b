# aap-server: slim image, unprivileged user, SQLite on the /data volume, health-checked.
#   docker build -t aap-server .
#   docker run -p 8000:8000 -v aap-data:/data -e AAP_API_KEYS=KEY:USER_ID:ORG_ID aap-server

FROM python:3.11-slim AS build
# A C compiler for the guardian's extension (aap_server/guardian/_native.c), in this stage
# only: the wheel carries it built, the final image no compiler.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY aap_server ./aap_server
COPY agents ./agents
# With the otel extra: tracing is then one OTEL_EXPORTER_OTLP_ENDPOINT away.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[otel]"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    AAP_HOST=0.0.0.0 \
    AAP_PORT=8000 \
    AAP_DB=/data/aap.db \
    AAP_LOG_FORMAT=json
COPY --from=build /wheels /wheels
# The import fails the build if the wheel came without the guardian's C extension (it is
# optional to pip: a compile error would otherwise leave the image on pure Python, silently).
RUN pip install --no-cache-dir /wheels/*.whl && python -c "from aap_server.guardian import _native" \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin aap \
    && mkdir /data && chown aap:aap /data
USER aap
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000
# 200 from GET /health (public unless public_meta = false): up, and its guardians answer.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('AAP_PORT', '8000'), timeout=4)"]
# Exec form: the server is PID 1 and gets SIGTERM itself (running turns finish within
# shutdown_grace_seconds). Binding 0.0.0.0 without AAP_API_KEYS is refused (exit code 2).
CMD ["aap-server", "serve"]
