# Operator image, built in two stages: a Go toolchain stage and a static, shell-less runtime.
# The worker image (which also needs Debian's kmod for modprobe) joins this file with cmd/worker.
#   docker build --target manager -t kmm-manager .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/manager ./cmd/manager

# Worker image: the static worker binary plus Debian's kmod for modprobe (kmod images carry only
# .ko files and depmod output, never a shell).
#   docker build --target worker -t kmm-worker .
FROM build AS build-worker
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/worker ./cmd/worker

FROM debian:bookworm-slim AS worker
RUN apt-get update \
    && apt-get install -y --no-install-recommends kmod \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-worker /out/worker /usr/local/bin/worker
ENTRYPOINT ["/usr/local/bin/worker"]

FROM gcr.io/distroless/static-debian12:nonroot AS manager
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
