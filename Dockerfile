# joulegate gateway (and agent) image. Multi-stage: the virtual environment is
# built in one stage, the runtime copies it, runs non-root, with a health check.
# The install steps are the README's: pip install the project.
#
#   docker build -t joulegate:0.1 .
#   docker build --build-arg BASE_IMAGE=<a Debian bookworm image with python3 and
#                python3-venv> --secret id=ca,src=<CA bundle> -t joulegate:0.1 .
#
# BASE_IMAGE must provide python3 (with venv). The optional `ca` secret is a CA
# bundle for pip behind a TLS-intercepting proxy; it is never stored in a layer.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY router ./router
COPY telemetry ./telemetry
COPY workers ./workers
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python3 -m venv /opt/joulegate \
 && /opt/joulegate/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/joulegate/bin/pip install --no-cache-dir . "gguf>=0.10"

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="joulegate" \
      org.opencontainers.image.description="Energy-aware OpenAI-compatible LLM gateway"
# state/ holds learned routing lengths, keys and the usage ledger; a new named
# volume mounted there inherits this ownership, so the non-root process can write it.
RUN useradd --system --uid 10001 --home-dir /srv/joulegate --create-home joulegate \
 && mkdir -p /srv/joulegate/state && chown 10001:10001 /srv/joulegate/state
COPY --from=build /opt/joulegate /opt/joulegate
WORKDIR /srv/joulegate
COPY --chown=joulegate:joulegate models.yaml ./
COPY --chown=joulegate:joulegate curves ./curves
COPY --chown=joulegate:joulegate deploy/models.*.yaml ./deploy/
ENV PATH=/opt/joulegate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    JOULEGATE_HOST=0.0.0.0 \
    JOULEGATE_STATE_DIR=/srv/joulegate/state \
    JOULEGATE_BOOTSTRAP_KEY=true \
    JOULEGATE_PORT=8000
USER 10001
EXPOSE 8000 9400
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2); sys.exit(0)"]
ENTRYPOINT ["joulegate"]
CMD ["serve"]
