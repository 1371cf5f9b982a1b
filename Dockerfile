# Operator image, built in two stages: a Go toolchain stage and a static, shell-less runtime.
# The worker image (which also needs Debian's kmod for modprobe) joins this file with cmd/worker.
#   docker build --target manager -t kmm-manager .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/manager ./cmd/manager

FROM gcr.io/distroless/static-debian12:nonroot AS manager
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
