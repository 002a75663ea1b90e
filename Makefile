# mindroomd — build, test and benchmark targets. CI runs `make test` through .ci/run.

GO        ?= go
# End-to-end encryption uses mautrix's pure-Go olm (goolm): no libolm and
# no cgo beyond SQLite's. Every go command below, and each one the tests
# start, builds with the tag.
export GOFLAGS := $(strip $(GOFLAGS) -tags=goolm)
PKGS      := ./...
BENCHTIME ?= 3x
# BENCH_N sizes the conversation the walk and deep-page benchmarks build.
BENCH_N   ?= 1000000

# The version `mindroomd version` prints: the commit, marked when the tree
# has changes no commit holds.
VERSION   = $(shell git describe --always --dirty 2>/dev/null || echo dev)

# staticcheck is pinned and built into the project's cache. Its file name
# carries the version, so raising the pin builds the new one rather than
# keep running the old.
STATICCHECK_VERSION := v0.8.2
STATICCHECK         := $(CURDIR)/.cache/bin/staticcheck-$(STATICCHECK_VERSION)

.PHONY: build test test-short bench bench-smoke lint tools fuzz dendrite demo

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/mindroomd ./cmd/mindroomd

# A local Dendrite, an agent and a person, end to end (./.demo);
# DEMO_KEEP=1 leaves the servers running. AGENT picks the back-end: echo,
# exec (examples/echo-agent.py) or openai (streamed, against a stand-in
# model server the demo runs). The room is end-to-end encrypted as Element
# creates one, the person writing from a device of her own; ENCRYPTED=0
# plays it in a room in the clear.
AGENT ?= echo
demo: ENCRYPTED ?= 1
demo: build dendrite
	$(GO) run ./cmd/demo -agent $(AGENT) -encrypted=$(ENCRYPTED)

test: lint dendrite
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	$(MAKE) bench-smoke
	$(MAKE) bench-pg-smoke
	$(MAKE) soak-ci
	$(MAKE) soak-ci-encrypted
	$(MAKE) soak-ci-retention
	$(MAKE) soak-ci-pg
	$(MAKE) soak-ci-replicas
	$(MAKE) fuzz FUZZTIME=3000x

test-short: dendrite
	$(GO) test -short -count=1 $(PKGS)

# Full benchmarks at 10^6 messages; the fixture is cached under .cache/bench.
bench: dendrite
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout 60m ./bench/ -args -n $(BENCH_N) | tee bench/last.txt
	$(GO) run ./bench/cmd/summary < bench/last.txt

# BenchmarkOutboxMemory at its full size (10^5 replies, minutes a round):
# the heap an outbox keeps per finished reply.
.PHONY: bench-memory
bench-memory:
	$(GO) test -run '^$$' -bench OutboxMemory -benchtime 1x -timeout 30m ./bench/ -args -memory

# Smoke mode: tiny fixtures, one iteration, so the benchmarks cannot rot.
bench-smoke: dendrite
	$(GO) test -short -run '^$$' -bench . -benchtime 1x -timeout 15m ./bench/

# The PostgreSQL benchmarks (BenchmarkPG*, and BenchmarkReplica* with a
# real Dendrite), opt-in through -pg: each starts a durable cluster of its
# own (or uses MINDROOM_TEST_PG_URL's server) and loads its fixture, no
# cache. Output in .cache/bench/last-pg.txt, then the
# summary table. bench-pg-smoke runs them on tiny fixtures, one round.
.PHONY: bench-pg bench-pg-smoke
bench-pg: dendrite
	@mkdir -p .cache/bench
	$(GO) test -run '^$$' -bench 'PG|Replica' -benchtime $(BENCHTIME) -timeout 60m ./bench/ -args -pg -n $(BENCH_N) | tee .cache/bench/last-pg.txt
	$(GO) run ./bench/cmd/summary < .cache/bench/last-pg.txt

bench-pg-smoke: dendrite
	$(GO) test -short -run '^$$' -bench 'PG|Replica' -benchtime 1x -timeout 15m ./bench/ -args -pg

# The kill-9 soak (bench/soak): a real Dendrite and bin/mindroomd answering
# through examples/echo-agent.py; a person posts SOAK_K messages at 20/s
# while the daemon is SIGKILLed and restarted SOAK_M times, then every
# message must have exactly one answer and the journal must owe nothing.
# soak-ci is the size CI runs (about a minute). soak-pg and soak-ci-pg are
# the same with the journal in PostgreSQL: a durable cluster the soak
# launches, or a schema of its own on MINDROOM_TEST_PG_URL's server.
# ENCRYPTED=1 plays either in an end-to-end encrypted room: the person
# writes from a device of her own and finds each answer by decrypting it,
# and the daemon, killed and restarted on the same device and crypto
# store, must go on decrypting and sealing. soak-ci-encrypted is the
# encrypted size CI runs, beside soak-ci's clear one. RETENTION=1 runs the
# daemon under retention at its tiniest windows (a second; identities
# 24h), a pass every second: soak-ci-retention on SQLite, and soak-ci-pg.
# soak-replicas runs three daemons with replicas: auto on the one
# PostgreSQL journal, six agents each in a room of its own; each kill takes
# one replica, whose agents the others take over until it rejoins.
# soak-ci-replicas is its size CI runs.
SOAK_K ?= 2000
SOAK_M ?= 30
.PHONY: soak soak-ci soak-ci-encrypted soak-ci-retention soak-pg soak-ci-pg soak-replicas soak-ci-replicas
soak soak-pg: ENCRYPTED ?= 0
soak soak-pg: RETENTION ?= 0
soak: build dendrite
	$(GO) run ./bench/soak -encrypted=$(ENCRYPTED) -retention=$(RETENTION) -k $(SOAK_K) -m $(SOAK_M)

soak-ci:
	$(MAKE) soak SOAK_K=200 SOAK_M=5 ENCRYPTED=0

soak-ci-retention:
	$(MAKE) soak SOAK_K=200 SOAK_M=5 ENCRYPTED=0 RETENTION=1

soak-ci-encrypted:
	$(MAKE) soak SOAK_K=100 SOAK_M=3 ENCRYPTED=1

soak-pg: build dendrite
	$(GO) run ./bench/soak -pg -encrypted=$(ENCRYPTED) -retention=$(RETENTION) -k $(SOAK_K) -m $(SOAK_M)

soak-ci-pg:
	$(MAKE) soak-pg SOAK_K=200 SOAK_M=5 ENCRYPTED=0 RETENTION=1

soak-replicas: build dendrite
	$(GO) run ./bench/soak -pg -replicas 3 -k $(SOAK_K) -m $(SOAK_M)

soak-ci-replicas:
	$(MAKE) soak-replicas SOAK_K=200 SOAK_M=5

# The journal under a chat's sustained load (bench/load): 20 principals ×
# 10 rooms, 300 events/s for 60 s, with readers, exporters and the outbox
# draining beside it; no homeserver. It fails on any lock error.
# LOAD_FLAGS adds flags (`go run ./bench/load -h` lists them); load-smoke
# runs 5 s.
LOAD_FLAGS ?=
.PHONY: load load-smoke
load:
	$(GO) run ./bench/load $(LOAD_FLAGS)

load-smoke:
	$(GO) run ./bench/load -short $(LOAD_FLAGS)

# gofmt also reads the files git does not track yet, so a new file is
# checked before its first commit rather than after.
lint: $(STATICCHECK)
	@files="$$(git ls-files --cached --others --exclude-standard '*.go')"; \
	unformatted="$$(gofmt -l $$files)"; \
	test -z "$$unformatted" || { echo "gofmt needed:"; echo "$$unformatted"; exit 1; }
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)

tools: $(STATICCHECK)

# Dendrite is the real homeserver the Matrix tests run against
# (testsupport/dendrite). Its binaries are file targets in the project's
# cache, so they are built once (about 150 s cold) and a tree that has them
# builds nothing. Raising the pin needs the old binaries removed first.
DENDRITE_VERSION := v0.13.8
DENDRITE_CMDS    := dendrite generate-keys generate-config
DENDRITE_BINS    := $(addprefix $(CURDIR)/.cache/bin/,$(DENDRITE_CMDS))

dendrite: $(DENDRITE_BINS)

$(DENDRITE_BINS) &:
	GOBIN=$(CURDIR)/.cache/bin $(GO) install $(addprefix github.com/matrix-org/dendrite/cmd/,$(addsuffix @$(DENDRITE_VERSION),$(DENDRITE_CMDS)))

$(STATICCHECK):
	GOBIN=$(CURDIR)/.cache/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(CURDIR)/.cache/bin/staticcheck $@

# Each fuzz target for FUZZTIME. make test gives each a count of inputs
# (3000x, 1 to 15 s here) rather than a time: Go 1.26's fuzzing
# coordinator can fail a target that found nothing when a time budget
# ends while a worker is mid-input (go.dev/issue/75804, fixed in 1.27), and
# a count has no deadline to race. A newly interesting input is minimised for
# at most FUZZMINIMIZETIME runs: by time, one large input (a 70 KiB seed)
# can stall the whole run minimising.
FUZZTIME         ?= 60s
FUZZMINIMIZETIME ?= 100x
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseEvent$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./journal/
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalJSON$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./journal/
	$(GO) test -run '^$$' -fuzz '^FuzzAdmitBatch$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./store/
	$(GO) test -run '^$$' -fuzz '^FuzzConfig$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./config/
	$(GO) test -run '^$$' -fuzz '^FuzzReply$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzIgnore$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzLeave$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzReadParams$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzStreamLastEventID$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzSend$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzReact$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzTyping$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzApprovalRequest$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzExecReply$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./agent/
