# rategate — `make test` is the one command that runs every test on a fresh
# Debian machine: it installs what the tests need when it is missing, then
# runs vet, the unit and integration tests with -race, and the e2e suite.

GO ?= go
APT_PACKAGES := redis-server redis-sentinel nginx libnginx-mod-http-lua curl docker-compose prometheus

.PHONY: test deps vet unit e2e deploy-check run build check fmt graph

test: deps vet deploy-check unit e2e

# Install the real servers the tests use when a binary is missing.
deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-sentinel >/dev/null 2>&1 || missing="$$missing redis-sentinel"; \
	command -v nginx >/dev/null 2>&1 || missing="$$missing nginx"; \
	test -e /usr/lib/nginx/modules/ngx_http_lua_module.so || missing="$$missing libnginx-mod-http-lua"; \
	command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	command -v prometheus >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		if [ "$$(id -u)" != 0 ]; then SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PACKAGES) >/dev/null || exit 1; \
	fi
	@redis-server --version | head -1; redis-sentinel --version | head -1; nginx -v 2>&1; promtool --version 2>&1 | head -1

# deploy/: the Kubernetes manifests (kustomize build, kubectl-validate against
# the API's schemas), the Prometheus rules (promtool check rules, promtool test
# rules) and configurations (promtool check config). The pinned Go tools are
# installed on first use into ~/.cache/rategate-tools (see deploy/check.sh).
deploy-check:
	GO=$(GO) bash deploy/check.sh

fmt:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet: fmt
	$(GO) vet ./...

# -p 1: one package at a time. The fault-injection, cluster-failover and
# multi-process tests assert answer times; on a 2-core machine two packages
# running at once starve each other and those bounds stop meaning anything.
unit:
	$(GO) test -race -count=1 -p 1 -timeout 20m ./...
	@# The hot-path allocation guards and the connection memory tests
	@# skip under -race (the race detector makes sync.Pool drop items and
	@# changes heap sizes), so they run once more without it.
	$(GO) test -count=1 -run 'Allocs|CostsNothing|ConnectionMemory' ./handler/ ./app/ ./limits/ ./limits/redisstore/
	@# The fault suite once more on the other way of deciding: EVALSHA
	@# instead of FCALL of the function library (redis.functions: false).
	$(GO) test -count=1 -timeout 10m ./faults/ -args -faults.functions=false

# The end-to-end suite (e2e/, build tag e2e): real redis-server, two rategate
# processes, real nginx for every config in nginx/, driven with curl.
e2e:
	$(GO) vet -tags e2e ./e2e/
	$(GO) test -tags e2e -count=1 -timeout 10m ./e2e/

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o rategate .

run:
	$(GO) run .

check:
	$(GO) run . -check -config $(CONFIG)

# The load benchmark, not part of `make test` (about 9 minutes): wrk and a
# fixed-rate generator against NGINX + rategate + Redis, against the minimal
# limiter a team would write (bench/minimal) and against a do-nothing floor,
# alternated, on loopback ports; installs wrk (and redis-server,
# redis-tools, nginx, linux-perf) when missing. Results: bench/results/.
# See bench/README.md for the knobs (BENCH_DURATION, BENCH_ROUNDS,
# BENCH_SCENARIOS, ...) and the targets.
.PHONY: bench
bench:
	bash bench/run.sh

# The import graph between rategate's own packages, one package a line with
# what it imports (docs/design.md carries this output; a test keeps it true).
graph:
	@$(GO) list -f '{{.ImportPath}}{{range .Imports}} {{.}}{{end}}' ./... | \
	  awk -v m='github.com/rategate/rategate' '{ \
	    name = $$1; sub("^" m "/?", "", name); if (name == "") name = "(main)"; \
	    out = ""; for (i = 2; i <= NF; i++) if (index($$i, m "/") == 1) { d = $$i; sub("^" m "/", "", d); out = out " " d } \
	    printf "%-22s ->%s\n", name, (out == "" ? " (none)" : out) }'
