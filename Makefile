# tollgate developer targets. `make test` runs the README's test command (.ci/test), as .ci/run does.
GO ?= go
PKGS := ./...
FUZZTIME ?= 20s

.PHONY: all build test agents bench bench-compare fuzz lint demo clean

all: lint test

build:
	$(GO) build -o bin/gateway ./cmd/gateway

## test: every test, with the race detector, after installing what the tests
## need when it is missing (the README's test command).
test:
	./.ci/test

## agents: Claude Code, Codex, opencode and the openai package's WebSocket
## client, at pinned versions installed from npm into a cache folder, run
## against a gateway in front of the fake upstream (deploy/agents).
agents:
	./.ci/agents

## bench: the hot-path benchmarks quoted in the notes.
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

## bench-compare: tollgate beside nginx and a direct connection, on
## loopback, in rounds (see cmd/bench-compare); ARGS passes flags, e.g.
## ARGS="-base main -shapes stream256,held".
bench-compare:
	$(GO) run ./cmd/bench-compare $(ARGS)

## fuzz: run each fuzz target for FUZZTIME (new corpus entries land in testdata/fuzz).
fuzz:
	@set -e; for pkg in ./sseparse ./internal/jsonscan ./internal/jsonl ./internal/jsonlog ./internal/retryhint ./ownership ./proxy ./spend ./stats; do \
	  for t in $$($(GO) test -list 'Fuzz.*' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

## lint: gofmt, go vet and staticcheck.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

demo:
	$(GO) run ./cmd/gateway demo

clean:
	rm -rf bin
