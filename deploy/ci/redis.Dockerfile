# CI only: a Redis image from Debian's package, for machines that cannot pull
# redis:7.4-alpine. Same use as the official image: redis-server and
# redis-cli on the PATH, run as nobody (nothing is written: no persistence).
ARG BASE_IMAGE=debian:bookworm-20250520-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/*
USER 65534
EXPOSE 6379
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--dir", "/tmp"]
