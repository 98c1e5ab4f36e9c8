# rategate's container image: a static binary on distroless, as non-root.
#
#     docker build -t rategate .
#     docker run --rm -p 8080:8080 rategate -redis redis://redis-host:6379/0
#
# docker-compose.yml builds it for the local gateway.

FROM golang:1.26 AS build
WORKDIR /src
# Modules in their own layer: rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/rategate .

# distroless has no shell and no HTTP client: take busybox's wget (a static
# binary) for the health check.
FROM busybox:1.36.1-musl AS busybox

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rategate /usr/local/bin/rategate
COPY --from=busybox /bin/busybox /usr/local/bin/busybox
# nonroot (65532) of the distroless image.
USER 65532:65532
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=2s --start-period=2s --retries=5 \
    CMD ["/usr/local/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/usr/local/bin/rategate"]
