# gpuaas — see README.md. `make lab` and `make test` are the two entry points.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
BIN := $(CURDIR)/bin
TEST_TIMEOUT ?= 20m
TEST_FLAGS ?=
# make lab LAB_FLAGS=-maas onboards the lab hosts through the MAAS simulator and gpuaas-bootstrap.
LAB_FLAGS ?=

.PHONY: all deps build lab test test-unit vet check bench soak clean clean-daemons fuzz ui-vendor

include images/guest/guest.mk
include images/cuda/cuda.mk

all: build

deps:
	@bash lab/install-deps.sh

build: deps
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $$($(GO) list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./... | grep -v -e /test/ -e /images/)

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

# What the tools already check: vet and gofmt, go.mod tidy (the u-root
# commands the guest image is built from are tool directives, so tidy keeps
# what they import), then staticcheck (a tool directive too, so no separate
# install). Part of make test.
check: vet
	$(GO) mod tidy -diff
	$(GO) tool staticcheck ./...

# Every test tier. Privileged tests (TestPrivileged*) need root and the
# packages deps installs; they skip without them unless
# GPUAAS_REQUIRE_PRIVILEGED=1 (set by .ci/run), which makes them fail.
# After the tests, clean-daemons stops the shared daemon set, then
# leakcheck fails the target if the run left a process, loop device, OVS
# bridge, libvirt domain, network namespace or nftables table behind
# (compared with a snapshot taken before it).
test: deps check
	@export GPUAAS_LEAKCHECK_RUN="make-test-$$$$-$$(date +%s)"; \
	snap=$$(mktemp); trap 'rm -f "$$snap"' EXIT; \
	$(GO) run ./test/leakcheck/cmd/leakcheck snapshot -o "$$snap" || exit 2; \
	rc=0; \
	echo "$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./..."; \
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./... || rc=$$?; \
	for d in third_party/*/; do echo "$(GO) test (patched copy) $$d"; (cd "$$d" && GOFLAGS=-mod=mod $(GO) test -count=1 .) || rc=$$?; done; \
	$(MAKE) --no-print-directory clean-daemons || rc=1; \
	$(GO) run ./test/leakcheck/cmd/leakcheck check -before "$$snap" || rc=1; \
	exit $$rc

# Go fuzz targets of the parsers that take outside input. make test runs
# their seeds and kept corpus (testdata/fuzz); make fuzz explores each for
# FUZZTIME and keeps what fails under testdata/fuzz.
FUZZTIME ?= 30s
FUZZ_TARGETS := FuzzApplyCommand:./coordinator/fsm FuzzDecodeBody:./proto FuzzOpenLayout:./agent/apprun FuzzSliceProvisionResult:./proto FuzzCheckJSONKeys:./proto FuzzAppManifest:./proto FuzzDecodeAuditLine:./proto FuzzAuditCanonical:./proto FuzzDecodeAuditAppend:./proto \
	FuzzParseCUDA:./agent/slice FuzzParseEntry:./lab/guestgpu FuzzParseRuntime:./agent/evidence \
	FuzzImageManifest:./proto FuzzParseImageSpec:./proto FuzzAllocationCreateBody:./coordinator/api \
	FuzzMAASResponses:./coordinator/maas FuzzReadFunction:./hostops/pci FuzzValidateDriver:./hostops/pci \
	FuzzParseUdevSignature:./agent/discovery FuzzParseDiskIDs:./agent/discovery \
	FuzzParseGPUHealth:./hostops/gpuhealth FuzzParse:./hostops/uevent FuzzImagePath:./agent/slice \
	FuzzParseRules:./hostops/ingress FuzzAppLaunchAndResult:./proto FuzzCARotationCommands:./coordinator/enroll \
	FuzzValidID:./proto
fuzz:
	@for t in $(FUZZ_TARGETS); do name=$${t%%:*}; pkg=$${t#*:}; \
		echo "fuzz $$name in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

test-unit:
	$(GO) test -count=1 -short ./...

# Benchmarks write test/bench/results/parts/*.json; benchmerge folds them
# into test/bench/results/latest.{json,md}.
# The etcd reference (test/bench/etcdref, its own module) runs first, on
# the same machine in the same run, for placements_vs_etcd_claims_ratio;
# the coordinator bench (placements) runs right after it, alone, with
# both built beforehand so no compiler shares the cores with either. The
# other benches follow one package at a time (-p 1): two packages' benches
# at once would measure each other.
bench: deps build
	cd test/bench/etcdref && $(GO) build -o $(CURDIR)/bin/etcdref .
	$(GO) test -count=1 -run '^$$' ./coordinator/server >/dev/null
	bin/etcdref -out $(CURDIR)/test/bench/results/parts/etcd.json
	GPUAAS_BENCH=1 $(GO) test -count=1 -timeout 30m -run '^TestBenchCoordinator$$' -v ./coordinator/server 2>&1 | tee test/bench/results/bench-coordinator.log | grep -E '^(=== RUN|--- |ok|FAIL|PASS)' || true
	GPUAAS_BENCH=1 $(GO) test -p 1 -count=1 -timeout 60m -run 'TestBench' -skip '^TestBenchCoordinator$$' -v ./... 2>&1 | tee test/bench/results/bench.log | grep -E '^(=== RUN|--- |ok|FAIL|PASS)' || true
	$(GO) run ./test/bench/cmd/benchmerge

# The fault rig (test/chaos) RUNS times, each a randomized short run with
# its own seed: 3 coordinators in network namespaces, a recorded workload,
# 4 faults of the nemesis' menu (kill -9, SIGSTOP, nftables partitions and
# one-way drops, ...), the porcupine and log-replay checkers; PARALLEL runs
# at once, each in its own namespaces. Writes test/bench/results/soak.md and
# parts/soak.json (soak_runs, soak_linearizability_violations,
# soak_double_claims, soak_lost_acks, date), which the bench report
# carries; porcupine's views of any violation go to .soak/.
# SOAK_UNTIL (RFC 3339 time) ends it early with the runs done by then.
# WORKFLOWS=1 also runs TestPrivilegedChaosWorkflows, once per round of
# PARALLEL runs (real agents and the MAAS simulator; MAAS faults, agent and leader
# kill -9 mid-workflow; ~70 s each): the summary counts its runs and
# adds soak_stuck_workflows.
RUNS ?= 200
WORKFLOWS ?=
SOAK_TESTS = $(if $(WORKFLOWS),^TestPrivilegedChaos(Workflows)?$$,^TestPrivilegedChaos$$)
PARALLEL ?= 3
SOAK_DURATION ?= 20s
SOAK_UNTIL ?=
soak: deps
	@set -o pipefail; mkdir -p test/bench/results; \
	GPUAAS_SOAK=1 GPUAAS_SOAK_UNTIL=$(SOAK_UNTIL) GPUAAS_SOAK_PARALLEL=$(PARALLEL) GPUAAS_CHAOS_DURATION=$(SOAK_DURATION) GPUAAS_CHAOS_OUT=$(CURDIR)/.soak \
		$(GO) test -count=$$(( ($(RUNS) + $(PARALLEL) - 1) / $(PARALLEL) )) -parallel $(PARALLEL) -timeout 0 -run '$(SOAK_TESTS)' -v ./test/chaos 2>&1 | tee test/bench/results/soak.log | \
		grep -E '^ *(--- |ok|FAIL|PASS)|(chaos|wf)_test.go:[0-9]+: (seed|ops) '; rc=$$?; \
	$(GO) run ./test/bench/cmd/benchmerge; exit $$rc

# The web console's vendored npm files (coordinator/ui/static, committed:
# the build needs no network for them). ui-vendor fetches each pinned
# package again with npm pack and checks the committed copy against it
# and against static/VENDOR.sums; UI_VENDOR_UPDATE=1 copies the fetched
# file over the committed one instead (then update VENDOR.sums).
ui-vendor:
	@set -e; d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
	grep -v '^#' coordinator/ui/static/VENDOR.sums | grep '@xterm/' | while read -r sum file pkg path; do \
		(cd "$$d" && npm pack --silent "$$pkg" >/dev/null); \
		tgz=$$(ls "$$d"/*.tgz); mkdir -p "$$d/x"; tar -xzf "$$tgz" -C "$$d/x"; rm -f "$$tgz"; \
		if [ -n "$(UI_VENDOR_UPDATE)" ]; then cp "$$d/x/package/$$path" coordinator/ui/static/$$file; fi; \
		cmp "$$d/x/package/$$path" coordinator/ui/static/$$file; \
		echo "$$sum  coordinator/ui/static/$$file" | sha256sum -c --quiet; echo "ok $$file = $$pkg $$path"; \
		rm -rf "$$d/x"; \
	done

lab: build
	$(BIN)/gpuaas-lab $(LAB_FLAGS)

# Stops the shared daemons (userspace Open vSwitch, virtlogd, libvirtd)
# the lab and the privileged tests start on demand, unless a running lab
# or test still uses them; never a daemon started otherwise.
clean-daemons:
	$(GO) run ./lab/cmd/gpuaas-daemons stop

# Deletes the binaries and the lab: .lab and the simulated host roots the
# lab generated under /dev/shm (gpuaas-lab clean; a running lab is
# refused: stop it first).
clean: clean-daemons
	$(GO) run ./lab/cmd/gpuaas-lab clean -dir .lab
	rm -rf $(BIN)
