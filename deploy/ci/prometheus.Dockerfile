# CI only: a Prometheus image from Debian's package, for machines that cannot
# pull prom/prometheus. Same layout as the official image: the binary is the
# entrypoint, data under /prometheus owned by nobody, wget for the health check.
ARG BASE_IMAGE=debian:bookworm-20250520-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown 65534:65534 /prometheus
WORKDIR /prometheus
USER 65534
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
