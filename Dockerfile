# rategate's container image: a static binary on an empty base, as non-root.
#
#     docker build -t rategate .
#     docker run --rm -p 127.0.0.1:8080:8080 rategate -redis redis://redis-host:6379/0
#
# (published on the host's loopback: rategate believes the identity headers
# it is sent, so only NGINX may reach /auth; docs/nginx.md, "Identity")
#
# docker-compose.yml builds it for the local gateway; deploy/kubernetes/ runs
# it (readOnlyRootFilesystem, every capability dropped).
#
# Base images are pinned to exact versions: the Go toolchain the project is
# tested with (go.mod) and busybox 1.36.1. The runtime stage is `scratch`,
# which has no version to drift; it gets CA certificates (for rediss://) from
# the build stage. Pin by digest too where your registry policy asks for it:
#     docker buildx imagetools inspect golang:1.26.8
FROM golang:1.26.8 AS build
WORKDIR /src
# Modules in their own layer: rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/rategate .

# No shell and no HTTP client in scratch: take busybox's wget (a static
# binary) for the compose health check. Kubernetes probes need none.
FROM busybox:1.36.1-musl AS busybox

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/rategate /usr/local/bin/rategate
COPY --from=busybox /bin/busybox /usr/local/bin/busybox
# A numeric non-root user (there is no /etc/passwd): Kubernetes'
# runAsNonRoot can check it.
USER 65532:65532
EXPOSE 8080 9090
HEALTHCHECK --interval=5s --timeout=2s --start-period=2s --retries=5 \
    CMD ["/usr/local/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/usr/local/bin/rategate"]
