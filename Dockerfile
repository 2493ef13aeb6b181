# Static ingress, worker, CLI (sluice) and demo-upstream binaries on a minimal base, run as a non-root user.
# The ingress is built without the quickstart's embedded NATS server (-tags noembed): the image
# always runs against a NATS cluster, and the binary is 13 MB smaller.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN go build -trimpath -tags noembed -ldflags="-s -w" -o /out/ingress ./cmd/ingress \
 && go build -trimpath -ldflags="-s -w" -o /out/worker ./cmd/worker \
 && go build -trimpath -ldflags="-s -w" -o /out/sluice ./cmd/sluice \
 && go build -trimpath -ldflags="-s -w" -o /out/upstream ./examples/upstream

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/ingress"]
CMD ["-config", "/etc/sluice/sluice.yaml"]
