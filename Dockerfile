# airlock's container image: a static binary on distroless, as a non-root user.
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t airlock .
#   docker run -p 8080:8080 -v airlock-data:/data airlock
# Not built on the machines airlock is developed on (they have no container daemon):
# see docs/deployment.md for what was and was not tried.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
# the Go client's module, which go.mod replaces with ./client
COPY client/go.mod client/go.sum ./client/
RUN go mod download
COPY . .
ARG VERSION=devel
ENV GOTOOLCHAIN=local CGO_ENABLED=0
RUN go build -trimpath \
      -ldflags "-s -w -X github.com/airlockhq/airlock/internal/version.Version=${VERSION}" \
      -o /out/airlock ./cmd/airlock \
 && mkdir -p /out/data

# distroless/static: CA certificates and /etc/passwd, no shell; "nonroot" is uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/airlock /usr/local/bin/airlock
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# SQLite by default, on the volume; set AIRLOCK_DATABASE_URL to a postgres:// URL (or
# host=… dbname=…) for PostgreSQL. Listen on every interface inside the container.
ENV AIRLOCK_DATABASE_URL=/data/airlock.db \
    AIRLOCK_LISTEN=0.0.0.0:8080
VOLUME ["/data"]
EXPOSE 8080
# Liveness (/healthz), not readiness: an orchestrator that replaces unhealthy containers
# (Swarm) must not replace every instance while the database restarts. Route traffic on
# /readyz (docs/deployment.md, Health checks).
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["/usr/local/bin/airlock", "healthcheck", "--live"]
ENTRYPOINT ["/usr/local/bin/airlock"]
CMD ["serve"]
