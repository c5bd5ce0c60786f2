# coordinatord — every target needs only Go and the Go module proxy.
GO      ?= go
BIN     := $(CURDIR)/bin
ARGS    ?=
# VERSION is what -version, coordctl version and coordinatord_build_info
# report: git describe of the checkout (v1.2.3, v1.2.3-4-gabcdef, -dirty with
# local changes), dev outside a git checkout; override with VERSION=...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/coordinatord/coordinatord/internal/version.Version=$(VERSION)

# The Go modules of this repository: the daemon (the root), the generated API
# (api/) and the Go SDK (client/), each its own module so that the SDK pulls
# in grpc and protobuf only; deploy/ (manifests and image) and tools/ (buf,
# golangci-lint). The root's go.mod builds api/ and client/ from this checkout
# (replace directives); go ./... in one module does not enter another.
SDK_MODULES := api client

.PHONY: all build image run test test-short chaos chaos-shards generate lint verify grpcurl clean bench bench-quick bench-go

all: build

## build: compile the daemon and the CLI into bin/coordinatord and bin/coordctl, stamped with VERSION
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/coordinatord ./cmd/coordinatord
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/coordctl ./cmd/coordctl

## image: build the container image without a container engine or a registry into bin/coordinatord-image.tar
## (the static daemon stamped with VERSION on an empty base, user 65532, an OCI layout that docker load also reads;
## deploy/README.md says how to push it; deploy/image, run by deploy/cmd/buildimage, tested by deploy's go test)
image:
	@mkdir -p $(BIN)
	cd deploy && $(GO) run ./cmd/buildimage -go $(GO) -root $(CURDIR) -version $(VERSION) -o $(BIN)/coordinatord-image.tar

## run: start the daemon on 127.0.0.1:7070 with an embedded etcd in ./coordinatord-data (pass flags with ARGS=...)
run: build
	$(BIN)/coordinatord $(ARGS)

## test: vet, every test against real etcd (embedded) and real gRPC, then all again under the race detector
## (liveness bounds such as "try-lock answers promptly" are asserted only in the first, race-free pass)
## (deploy/ is its own module: its test builds the kustomizations, decodes every manifest with the Kubernetes API types,
## validates it against the Kubernetes OpenAPI schema embedded in kustomize, runs the Dockerfile's go build line,
## and builds the image as make image does, reads it back, checks its config and runs the binary from its layer)
## (and every testing.B benchmark runs once, so a broken benchmark fails here, not in someone's bench run)
## (client/, the Go SDK's module, tests against a coordinatord it builds from this checkout, and checks its own module graph)
## (while both lock cores exist, the suites that serve locks run again on the shard-owner core: COORDINATORD_TEST_CORE=shard)
test:
	$(GO) vet ./...
	for m in $(SDK_MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	$(GO) test -count=1 -timeout 10m ./...
	cd client && $(GO) test -count=1 -timeout 5m ./...
	COORDINATORD_TEST_CORE=shard $(GO) test -count=1 -timeout 10m ./internal/server ./internal/daemon ./fence/... ./cmd/coordctl ./cmd/coordinatord ./examples/...
	cd client && COORDINATORD_TEST_CORE=shard $(GO) test -count=1 -timeout 5m ./...
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./internal/...
	$(GO) test -race -count=1 -timeout 15m ./...
	cd client && $(GO) test -race -count=1 -timeout 5m ./...
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...

## test-short: the fast tests only, without the race detector
test-short:
	$(GO) test -short -count=1 ./...
	cd client && $(GO) test -short -count=1 ./...

## chaos: CHAOS_RUNS randomized fault schedules (default 20) against a 3-member etcd cluster, each
## history checked for linearizability; each run prints its seed, CHAOS_SEED=n replays one
CHAOS_RUNS ?= 20
chaos:
	CHAOS_RUNS=$(CHAOS_RUNS) $(GO) test -count=1 -timeout 60m -run '^TestChaosRandomized$$' -v ./internal/chaos

## chaos-shards: the same on the shard-owner core (TestChaosRandomizedShards: 2 or 3 members, member 0's clock 5% fast
## and member 1's 5% slow, sometimes a relay; plus an owner cut off past its lease, a member killed right after a grant,
## rolling restarts); CHAOS_SEED=n replays one
chaos-shards:
	CHAOS_RUNS=$(CHAOS_RUNS) $(GO) test -count=1 -timeout 60m -run '^TestChaosRandomizedShards$$' -v ./internal/chaos

## bench: the full side-by-side benchmark (coordinatord vs etcd Mutex, v3lock, linearizable Get; ~15 min on 2 cores);
## writes docs/benchmarks/results.md and chart.svg, CPU profiles into bin/profiles (pass flags with ARGS=...);
## then the shard core's replicas (1, 3, 8 members) and failover (rolling restart, kill -9) cells (~3 min)
## into docs/benchmarks/results-shard-replicas.md
bench:
	$(GO) build -o $(BIN)/coordbench ./cmd/coordbench
	$(BIN)/coordbench -profile-dir bin/profiles $(ARGS)
	$(BIN)/coordbench -core shard -scenarios replicas,failover -out docs/benchmarks/results-shard-replicas.md -svg '' $(ARGS)

## bench-quick: the same scenarios, short (about 3 minutes); writes bin/bench-quick.md and bin/bench-quick.svg,
## and bin/bench-quick-shard.md (the shard core's replicas and failover cells, one failover)
bench-quick:
	$(GO) build -o $(BIN)/coordbench ./cmd/coordbench
	$(BIN)/coordbench -quick -out $(BIN)/bench-quick.md -svg $(BIN)/bench-quick.svg $(ARGS)
	$(BIN)/coordbench -quick -core shard -scenarios replicas,failover -out $(BIN)/bench-quick-shard.md -svg '' $(ARGS)

## bench-go: the testing.B micro- and end-to-end benchmarks of the hot paths
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...

# buf and golangci-lint live in their own module (tools/go.mod): buf needs a
# newer protobuf runtime than the daemon builds with, and golangci-lint's ~190
# modules stay out of the daemon's go.mod. Each is built once into bin/ and
# rebuilt only when tools/go.mod or go.sum change (golangci-lint from a cold Go
# build cache: ~4 min on 2 shared cores, seconds once the cache is warm).
$(BIN)/buf: tools/go.mod tools/go.sum
	cd tools && $(GO) build -o $(BIN)/buf github.com/bufbuild/buf/cmd/buf

$(BIN)/golangci-lint: tools/go.mod tools/go.sum
	cd tools && $(GO) build -o $(BIN)/golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint

## generate: lint the proto and regenerate api/ with buf and the local plugins pinned in go.mod, then from the
## protos the API reference (docs/API.md, from their comments) and the Node client's descriptor set
## (examples/node/src/descriptor.ts) with internal/cmd/apigen
generate: $(BIN)/buf
	$(BIN)/buf lint
	$(BIN)/buf generate
	$(BIN)/buf build -o $(BIN)/api-image.binpb
	$(GO) run ./internal/cmd/apigen -image $(BIN)/api-image.binpb -doc docs/API.md -node examples/node/src/descriptor.ts

## lint: buf lint, gofmt, go vet, then golangci-lint (.golangci.yml) over every Go module (the root, api/, client/, deploy/)
lint: $(BIN)/buf $(BIN)/golangci-lint
	$(BIN)/buf lint
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(BIN)/golangci-lint run ./...
	for m in $(SDK_MODULES) deploy; do (cd $$m && $(GO) vet ./... && $(BIN)/golangci-lint run ./...) || exit 1; done

## verify: regenerate and fail if generated code, go.mod/go.sum or formatting differ from what is committed
verify: generate lint
	$(GO) mod tidy
	for m in $(SDK_MODULES) tools deploy; do (cd $$m && $(GO) mod tidy) || exit 1; done
	@git diff --exit-code -- api docs/API.md examples/node/src/descriptor.ts client/go.mod client/go.sum go.mod go.sum tools/go.mod tools/go.sum deploy/go.mod deploy/go.sum || { echo "generated code or go.mod is stale: run 'make generate' and 'go mod tidy', then commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api)" || { echo "untracked generated files:"; git status --porcelain -- api; exit 1; }

## grpcurl: install grpcurl v1.9.4 into bin/ (for the walkthrough in docs/WALKTHROUGH.md)
grpcurl: $(BIN)/grpcurl
$(BIN)/grpcurl:
	GOBIN=$(BIN) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4

clean:
	rm -rf $(BIN)
