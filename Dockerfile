# syntax=docker/dockerfile:1
# One image with all four binaries; docker-compose.yml picks one per service.
#   docker build -t seckill .

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
# The version -version and seckill_build_info report: docker build --build-arg VERSION=$(git describe --always)
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    make build BIN=/out BUILDFLAGS="-trimpath -ldflags='-s -w -X github.com/seckill/seckill/internal/version.Version=${VERSION}'" \
 && for b in proxy backend worker bench; do test -x "/out/$b" || { echo "missing /out/$b" >&2; exit 1; }; done

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
COPY conf/seckill.toml /etc/seckill/seckill.toml
USER nonroot:nonroot
# proxy, proxy admin, backend, worker health/metrics
EXPOSE 8080 8081 8090 8091
ENTRYPOINT []
CMD ["/usr/local/bin/backend", "-config", "/etc/seckill/seckill.toml"]
