# syntax=docker/dockerfile:1
# stagescope images for the local stack (docker-compose.yml):
#   target `runtime`: `stagescope serve` (the reference service), also `stagescope load` and
#                     `stagescope gpu-exporter`; non-root, no build tools, no sources.
#   target `lab`:     JupyterLab over an editable install, so a mounted analysis/ is live.
ARG PYTHON_IMAGE=python:3.11.10-slim-bookworm

# ---- build: resolve and install into a virtualenv that the runtime copies ------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Dependencies first (cached while only sources change), then the project itself.
COPY pyproject.toml README.md LICENSE ./
RUN mkdir stagescope && touch stagescope/__init__.py \
    && pip install ".[serve,loadgen,gpu]" \
    && pip uninstall -y stagescope && rm -rf stagescope build
COPY . .
RUN pip install --no-deps ".[serve,loadgen,gpu]" && stagescope --help >/dev/null

# ---- runtime ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 stagescope \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home stagescope
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=6 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"]
CMD ["stagescope", "serve", "--host=0.0.0.0", "--port=8000"]

# ---- lab -------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS lab
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 stagescope \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home stagescope
WORKDIR /app
COPY --from=build /src /app
RUN python -m venv /opt/venv && pip install -e ".[analysis,notebooks,lab]" && chown -R 10001:10001 /app
USER 10001:10001
EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--notebook-dir=/app"]
