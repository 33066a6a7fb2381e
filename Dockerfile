# tollgate's container image: a static gateway binary on distroless, run as a
# non-root user.
#
#   docker build -t tollgate/gateway:dev --build-arg VERSION=dev .
#   docker run --rm -p 127.0.0.1:8080:8080 tollgate/gateway:dev
#
# The image runs `gateway serve -config /etc/tollgate/gateway.toml` (the
# repository's starter gateway.toml: callers' keys passed through to OpenAI
# and Anthropic, every other setting at its default; docs/gateway.toml lists
# them all); mount another file there to change it, as docker-compose.yml
# does. State (the spend file, Redis
# spill files and their locks) goes to /var/lib/tollgate, the working
# directory: mount a volume there to keep it. The same image also runs
# `gateway mock-upstream` and `gateway bench` (the compose demo profile).
#
# It builds with the classic builder as well as BuildKit (no RUN --mount),
# and deploy/dockerfile_test.go checks this file and runs its go build
# command on the host with the same flags.

# The Go toolchain: 1.26, the minor version of go.mod's go directive.
# GOTOOLCHAIN=local makes a too-old image fail the build instead of
# downloading another toolchain.
ARG GO_IMAGE=golang:1.26
# The run-time base: no shell, no package manager; CA certificates (for https
# upstreams), tzdata and a "nonroot" user (65532) included.
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download && go mod verify
COPY . .
ARG VERSION=dev
RUN go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o /out/gateway ./cmd/gateway
# The state directory, created here because the final image has no shell.
RUN mkdir -p /out/state

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/gateway /usr/local/bin/gateway
COPY --from=build /src/gateway.toml /etc/tollgate/gateway.toml
COPY --from=build --chown=65532:65532 /out/state /var/lib/tollgate
WORKDIR /var/lib/tollgate
USER 65532:65532
EXPOSE 8080
# No HEALTHCHECK: the image has no shell or HTTP client, and the gateway has
# no health-check subcommand. Probe GET /healthz (live) and GET /readyz
# (ready) from outside, as an orchestrator does.
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["serve", "-config", "/etc/tollgate/gateway.toml"]
