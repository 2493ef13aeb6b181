# Sluice — make targets. `make test` is what CI runs (.ci/run) and what the README tells you to run.
SHELL := /bin/bash
GO ?= go
# Tests that need redis-server or NATS fail instead of skipping under `make test`.
export SLUICE_STRICT := 1

.PHONY: test deps vet unit fuzz quickstart bench

test: deps vet unit fuzz

# deps installs redis-server from Debian when it is missing (as root), or says how.
deps:
	@if ! command -v redis-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "redis-server is missing; install it with: sudo apt-get install -y redis-server" >&2; exit 1; \
	  fi; \
	fi
	@redis-server --version

vet:
	$(GO) vet ./...

unit:
	$(GO) test -race -count=1 -timeout 14m ./...

# A short run of every fuzz target, on top of the committed seed corpora that `unit` already ran.
FUZZ_TIME ?= 5s
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZ_TIME) $$pkg >/dev/null; \
	  done; \
	done

quickstart:
	$(GO) run ./cmd/ingress -config examples/quickstart.yaml

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
