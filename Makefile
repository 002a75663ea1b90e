# mindroomd — build, test and benchmark targets. CI runs `make test` through .ci/run.

GO        ?= go
PKGS      := ./...
BENCHTIME ?= 3x
# BENCH_N sizes the conversation the walk and deep-page benchmarks build.
BENCH_N   ?= 1000000

.PHONY: build test test-short bench bench-smoke lint fuzz

build:
	$(GO) build -o bin/mindroomd ./cmd/mindroomd

test: lint
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	$(MAKE) bench-smoke
	$(MAKE) fuzz FUZZTIME=3s

test-short:
	$(GO) test -short -count=1 $(PKGS)

# Full benchmarks at 10^6 messages; the fixture is cached under .cache/bench.
bench:
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout 60m ./bench/ -args -n $(BENCH_N) | tee bench/last.txt
	$(GO) run ./bench/cmd/summary < bench/last.txt

# Smoke mode: tiny fixtures, one iteration, so the benchmarks cannot rot.
bench-smoke:
	$(GO) test -short -run '^$$' -bench . -benchtime 1x -timeout 15m ./bench/

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1)
	$(GO) vet $(PKGS)

# Each fuzz target for FUZZTIME. A newly interesting input is minimised for
# at most FUZZMINIMIZETIME runs: by time, one large input (a 70 KiB seed)
# can stall the whole run minimising.
FUZZTIME         ?= 60s
FUZZMINIMIZETIME ?= 100x
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseEvent$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./journal/
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalJSON$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./journal/
	$(GO) test -run '^$$' -fuzz '^FuzzAdmitBatch$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./store/
