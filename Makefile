# Sluice — make targets. `make test` is what CI runs (.ci/run) and what the README tells you to run.
SHELL := /bin/bash
GO ?= go
# Tests that need redis-server or NATS fail instead of skipping under `make test`.
export SLUICE_STRICT := 1
# `make test` runs every stage even when one fails, and fails at the end: a red package does
# not hide whether cmd/worker or the fuzz pass would have passed.
MAKEFLAGS += --keep-going

.PHONY: test deps vet tools cyclo lines compose unit unit-vet fuzz quickstart bench soak

test: deps cyclo lines compose unit-vet fuzz

# deps installs what the tests run besides Go — redis-server, gcc for -race (without a C
# compiler on PATH Go turns cgo off, and -race refuses to run), curl for the README's quickstart
# lines, docker-compose to validate deploy/compose.yaml, chromium for the dashboard's browser
# test — from Debian when missing (as root), or says how.
DEPS := redis-server:redis-server gcc:gcc curl:curl docker-compose:docker-compose chromium:chromium
deps:
	@missing=""; for d in $(DEPS); do command -v $${d%%:*} >/dev/null 2>&1 || missing="$$missing $${d#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing with apt-get"; \
	    apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing:$$missing; install with: sudo apt-get install -y$$missing" >&2; exit 1; \
	  fi; \
	fi
	@redis-server --version

# The linters, pinned, installed from the module proxy into $(go env GOPATH)/bin when missing
# or at another version.
STATICCHECK_VERSION := v0.8.2
GOCYCLO_VERSION := v0.6.0
# deadcode is versioned with golang.org/x/tools, the module it is installed from.
DEADCODE_VERSION := v0.52.0
GOBIN := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
GOCYCLO := $(GOBIN)/gocyclo
DEADCODE := $(GOBIN)/deadcode
tools:
	@$(STATICCHECK) -version 2>/dev/null | grep -q '($(STATICCHECK_VERSION:v%=%))' || \
	  GOBIN=$(GOBIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@$(GO) version -m $(GOCYCLO) 2>/dev/null | grep -q 'gocyclo[[:space:]]*$(GOCYCLO_VERSION)' || \
	  GOBIN=$(GOBIN) $(GO) install github.com/fzipp/gocyclo/cmd/gocyclo@$(GOCYCLO_VERSION)
	@$(GO) version -m $(DEADCODE) 2>/dev/null | grep -q 'golang.org/x/tools[[:space:]]*$(DEADCODE_VERSION)[[:space:]]' || \
	  GOBIN=$(GOBIN) $(GO) install golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION)

# vet: go vet (also under the noembed tag), staticcheck, deadcode and gofmt. deadcode -test
# lists the functions that neither a main nor a test reaches (a helper only tests use is live);
# it exits 0 when it lists some, so its output is the verdict.
vet: tools
	$(GO) vet ./...
	$(GO) vet -tags noembed ./internal/app/ ./cmd/ingress/
	$(STATICCHECK) ./...
	@dead=$$($(DEADCODE) -test ./...) || exit 1; \
	if [ -n "$$dead" ]; then echo "deadcode -test: unreachable functions; remove them:" >&2; echo "$$dead" >&2; exit 1; fi
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt -l:" $$unformatted >&2; exit 1; fi

# cyclo: no production function (non-test .go file) above cyclomatic complexity 20; gocyclo
# exits non-zero, naming them, when one is. Part of `make test`.
cyclo: tools
	$(GOCYCLO) -over 20 $$(git ls-files '*.go' | grep -v '_test\.go$$')

# lines: no production file (non-test .go file) above MAX_LINES lines; split a longer one into
# files named for the concepts it holds. Part of `make test`.
MAX_LINES := 600
lines:
	@long=$$( (git ls-files '*.go' 2>/dev/null || find . -name '*.go') | grep -v '_test\.go$$' | xargs wc -l | \
	  awk '$$2 != "total" && $$1 > $(MAX_LINES) { print "  " $$2 ": " $$1 " lines" }'); \
	if [ -n "$$long" ]; then echo "production files over $(MAX_LINES) lines:" >&2; echo "$$long" >&2; exit 1; fi

# No Docker engine runs here; the compose file is validated, not started.
compose:
	docker-compose -f deploy/compose.yaml config -q

# cmd/worker's process tests measure drain rates against the clock, so they run on their own
# after the rest rather than beside another package's tests on a 2-core machine. Inside it, the
# few long tests that pace slow drains on queues of their own (t.Parallel) run together, four at
# once, after the others: they wait far more than they compute. Adding the failover and
# restart tests that mostly wait (TestJetStreamFailoverLosesNothing,
# TestScheduledJobsSurviveRestarts) to the group was measured: beside two busy loops, the four
# passed alone and two of them missed with the six (BENCHMARKS.md, "make test's wall time").
# The other packages run UNIT_P (3) at a time, in the order given: the longest (SLOW, longest
# first, by CI's package times) start first, so that the short ones fill in beside them at the
# end instead of one long package running alone last. They wait far more than they compute
# (internal/worker and internal/app ~0.2 cores each), so three at a time should pack CI's 629 s
# of package time (at 2983aba) into ~214 s where two at a time took ~315 s: computed from CI's
# package times, not yet measured on a quiet machine (BENCHMARKS.md, "make test's wall time,
# second pass"); `make test UNIT_P=2` runs them two at a time.
TIMED := github.com/sluice-rl/sluice/cmd/worker
UNIT_P := 3
SLOW := internal/worker internal/app queue cmd/ingress limit internal/admin internal/ingress inflight
UNIT_PKGS = $$($(GO) list ./... | grep -v -x '$(TIMED)' | \
	  awk 'BEGIN { n = split("$(SLOW)", s, " "); for (i = 1; i <= n; i++) rank["github.com/sluice-rl/sluice/" s[i]] = i } \
	    { print (($$0 in rank) ? rank[$$0] : n + 1) "\t" $$0 }' | sort -s -n -k1,1 | cut -f2)
unit:
	rc=0; \
	$(GO) test -race -count=1 -p $(UNIT_P) -timeout 14m $(UNIT_PKGS) || rc=1; \
	$(GO) test -race -count=1 -parallel 4 -timeout 13m $(TIMED) || rc=1; \
	exit $$rc

# unit-vet is `make unit` with `make vet` run at nice 19 beside its first stage, as `make test`
# runs them: vet (~110 s of CPU, ~60 s on its own on 2 cores) takes the CPU that the first
# stage's waiting tests leave; at nice 19 (weight 15 against a test's 1024) it gets ~1.5% of a
# core that a test wants, a far lighter neighbour than the two busy loops every timing test is
# held to. On a machine with no idle CPU it ends late and holds back cmd/worker's stage. After
# vet, the same niced job compiles cmd/worker's race test binary and the worker and upstream
# commands its TestMain builds, into the build cache, so that cmd/worker's stage mostly links.
# cmd/worker's stage starts once that job has ended. vet's output is shown after the first
# stage's, and a failing vet fails the target.
unit-vet: tools
	rc=0; vetlog=$$(mktemp); \
	( nice -n 19 $(MAKE) --no-print-directory vet >$$vetlog 2>&1; vetrc=$$?; \
	  prebuilt=$$(mktemp -d); nice -n 19 $(GO) test -race -c -o /dev/null $(TIMED) >/dev/null 2>&1; \
	  nice -n 19 $(GO) build -o $$prebuilt/ ./cmd/worker ./cmd/worker/testdata/upstream >/dev/null 2>&1; \
	  rm -rf $$prebuilt; exit $$vetrc ) & vet=$$!; \
	$(GO) test -race -count=1 -p $(UNIT_P) -timeout 14m $(UNIT_PKGS) || rc=1; \
	if wait $$vet; then echo "make vet (nice 19, beside the packages above): passed"; cat $$vetlog; \
	else echo "make vet (nice 19, beside the packages above): FAILED" >&2; cat $$vetlog >&2; rc=1; fi; \
	rm -f $$vetlog; \
	$(GO) test -race -count=1 -parallel 4 -timeout 13m $(TIMED) || rc=1; \
	exit $$rc

# A short run of every fuzz target, on top of the committed seed corpora that `unit` already ran.
# The targets are read from the sources (`go test -list` would build and link a plain test
# binary of each package only to name them). Each package's instrumented test binary is built
# once (`go test -c -fuzz`) and runs its targets one after the other, as `go test -fuzz` runs
# it: from the package's directory, with the same fuzz cache (-test.fuzzcachedir) and the
# same 10-minute timeout; `go test -fuzz` per target relinked internal/ingress's binary for
# each of its six targets.
# A failing target is shown and run once more: an input that breaks the code is saved under
# testdata/fuzz and fails the second run at once, while the fuzzing engine's own rare failures on
# a loaded machine (a worker that stops answering) do not repeat.
FUZZ_TIME ?= 3s
fuzz:
	@set -e; bin=$$(mktemp -d); trap 'rm -rf "$$bin"' EXIT; \
	mod=$$($(GO) list -m); cache=$$($(GO) env GOCACHE)/fuzz; \
	for pkg in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u); do \
	  $(GO) test -c -fuzz . -o "$$bin/fuzz.test" $$pkg; \
	  for f in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$pkg/*_test.go); do \
	    echo "fuzz $$pkg $$f"; \
	    run=(env -C $$pkg "$$bin/fuzz.test" -test.paniconexit0 -test.timeout=10m -test.run '^$$' \
	      -test.fuzz "^$$f$$" -test.fuzztime $(FUZZ_TIME) -test.fuzzcachedir "$$cache/$$mod/$${pkg#./}"); \
	    if ! out=$$("$${run[@]}" 2>&1); then \
	      echo "$$out" | tail -30; echo "fuzz $$pkg $$f failed; running it again"; \
	      "$${run[@]}"; \
	    fi; \
	  done; \
	done

quickstart:
	$(GO) run ./cmd/ingress -config examples/quickstart.yaml

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# soak: the long runs kept out of `make test` (minutes each): an LLM-shaped drain at full scale
# (60/m and 20000 tokens/m, 3-minute backlog, with and without cost_rate), a flood of 3 million limiter keys,
# a fair queue with 10 000 tenants beside FIFO, a 60s unit share of a fair queue (fair_by: units), a global rule of 1000/min split between two regions, two regions over
# gateways 50 ms apart sharing 100/s (backlogs of 9 000 and 1 000; a 30 s cut), the rate at the upstream under SIGSTOPped
# workers, and Sluice beside nginx, HAProxy, Caddy and BullMQ (installs them). Figures go to
# BENCHMARKS.md.
soak: deps
	$(GO) test -run '^$$' -bench MemoryKeyFlood -benchtime 1x ./limit/
	$(GO) test -run '^$$' -bench FairDrain -benchtime 1x -count 3 ./cmd/worker/
	$(GO) test -run '^$$' -bench UpstreamUnderStalls -benchtime 1x ./cmd/worker/
	SLUICE_COST_WINDOW=1m $(GO) test -count=1 -timeout 15m -run '^TestCostBudgetDrain$$' -v ./cmd/worker/
	SLUICE_FAIR_DRAIN=60s $(GO) test -count=1 -timeout 10m -run '^TestFairShareByUnits$$' -v ./internal/worker/
	SLUICE_RULE_PERIOD=1m $(GO) test -count=1 -timeout 15m -run '^TestGlobalRuleTwoRegions(GCRA)?$$' -v ./internal/app/
	SLUICE_REGIONS_SOAK=1 $(GO) test -count=1 -timeout 10m -run '^TestRegionsGateway(Share|Cut|Independent)$$' -v ./internal/worker/
	scripts/bench-peers.sh 5 3 20000
