# kmm's two images for those with a Docker engine:
#   docker build --target manager -t kmm-manager .
#   docker build --target worker -t kmm-worker .
# `make images` builds the same content without any engine (hack/images, docs/images.md): same
# paths, same Debian files, same non-root manager. Its tests parse this file and check that the
# worker stage copies exactly the files the builder puts in the image (hack/images/worker-files.txt).

# The Go binaries: static, no file system paths, no build ID, no VCS stamp; cross-compiled for the
# target platform under BuildKit (docker buildx build --platform linux/amd64,linux/arm64).
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags="-s -w -buildid=" -o /out/ ./cmd/manager ./cmd/worker

# Debian's files: kmod's modprobe and depmod, the shared libraries and dynamic loader they need, the
# CA bundle, and the merged-/usr links on the way to them, as hack/images/worker-files.txt lists
# them for the architecture; a listed path that is missing fails the build.
FROM debian:bookworm-slim AS worker-rootfs
RUN apt-get update \
    && apt-get install -y --no-install-recommends kmod ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY hack/images/worker-files.txt /tmp/worker-files.txt
RUN set -eu; arch="$(dpkg --print-architecture)"; mkdir /rootfs; cd /; \
    grep -v '^#' /tmp/worker-files.txt | while read -r only pattern; do \
        [ "$only" = all ] || [ "$only" = "$arch" ] || continue; \
        for f in $pattern; do \
            if [ ! -e "$f" ] && [ ! -L "$f" ]; then echo "worker-files.txt: $f is missing" >&2; exit 1; fi; \
            cp -a --parents "${f#/}" /rootfs/; \
        done; \
    done

# Worker image: the static worker, Debian's modprobe and depmod with their libraries and loader,
# and the CA bundle (the worker pulls kmod images over TLS); no shell, no package manager. It runs
# as root: it loads kernel modules (the pod grants CAP_SYS_MODULE).
FROM scratch AS worker
COPY --from=worker-rootfs /rootfs/ /
COPY --from=build /out/worker /usr/local/bin/worker
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENTRYPOINT ["/usr/local/bin/worker"]

# Operator image: the static manager and the CA bundle, run as 65532:65532; nothing else.
FROM scratch AS manager
COPY --from=worker-rootfs /rootfs/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/manager /manager
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER 65532:65532
ENTRYPOINT ["/manager"]
