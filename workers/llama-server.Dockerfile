# CPU llama.cpp worker: llama-server built from the llama.cpp sources vendored
# in the pinned llama-cpp-python sdist (the same build script as `make run`).
#
#   docker build -f workers/llama-server.Dockerfile -t joulegate-llama-server:0.3.36-cpu .
#
# BASE_IMAGE must be Debian bookworm with python3; the optional `ca` secret is a
# CA bundle for reaching PyPI, never stored in a layer.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake g++ make \
 && rm -rf /var/lib/apt/lists/*
COPY workers/build_llama_server.sh workers/fetch_sdist.py /src/
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi \
 && JOULEGATE_CACHE=/build LLAMA_CPP_PYTHON_VERSION=${LLAMA_CPP_PYTHON_VERSION} \
    bash /src/build_llama_server.sh \
 && cp /build/llama-server-${LLAMA_CPP_PYTHON_VERSION}-cpu/bin/llama-server /usr/local/bin/ \
 && rm -rf /build

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="joulegate-llama-server" \
      org.opencontainers.image.description="llama.cpp llama-server (CPU) from the llama-cpp-python sdist"
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10002 --no-create-home llama
COPY --from=build /usr/local/bin/llama-server /usr/local/bin/llama-server
RUN llama-server --version
USER 10002
EXPOSE 8080
ENTRYPOINT ["llama-server"]
