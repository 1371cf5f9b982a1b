# kmm — run `make help` for the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

BIN := $(CURDIR)/bin
TOOLS_MOD := test/tools/go.mod

CONTROLLER_TOOLS_VERSION := v0.23.0
GOLANGCI_LINT_VERSION := v2.15.0
# v5.8.3 needs a newer Go than this machine's 1.26.
KUSTOMIZE_VERSION := v5.8.2

CONTROLLER_GEN := $(BIN)/controller-gen
GOLANGCI_LINT := $(BIN)/golangci-lint
KUSTOMIZE := $(BIN)/kustomize
HELM := $(BIN)/helm
HELM_MOD := test/tools/helm/go.mod
CONTROL_PLANE := $(BIN)/etcd $(BIN)/kube-apiserver $(BIN)/kube-controller-manager $(BIN)/kube-scheduler

# envtest finds etcd and kube-apiserver here (see test/envtest).
export KUBEBUILDER_ASSETS := $(BIN)

GO_TEST_FLAGS ?= -count=1
# Random interleavings the property test runs (SPEC §10: at least 10,000 per CI run).
RAPID_CHECKS ?= 10000
# The seed of those interleavings: the first 15 hex digits of the commit under test, so that a run
# is reproducible for a commit but explores new interleavings as the code changes (1 outside a git
# checkout). `make test` prints it; a failure is replayed with `make test RAPID_SEED=<seed>` or
# `RAPID_SEED=<seed> go test ./fsm -run <test>` (docs/evidence.md). RAPID_SEED=0 draws a fresh seed.
RAPID_SEED ?= $(shell c=$$(git rev-parse --short=15 HEAD 2>/dev/null) && printf '%d' 0x$$c || echo 1)
# How long `make fuzz` runs each fuzz target.
FUZZ_TIME ?= 20s
# 1: `make fuzz` copies the new inputs the fuzzer found interesting into the package's
# testdata/fuzz (test/scripts/keep-fuzz-corpus.sh), for a developer to commit; CI's throwaway
# clone runs with 0.
FUZZ_KEEP ?= 1
# Fuzz targets, as package:target[:fuzztime]. Each runs a count of inputs, not a duration (about 20 s
# each here): when the deadline of a -fuzztime duration falls while the fuzzer minimizes a new input,
# Go reports "context deadline exceeded" as a failure (seen on FuzzLabelKeys), and a slow rapid
# interleaving of FuzzModel cut by the deadline likewise.
FUZZ_TARGETS := ./fsm:FuzzModel:30000x ./fsm:FuzzLabelKeys:20000x ./internal/kernel:FuzzParse:300000x ./internal/kernel:FuzzParseRange:300000x ./sign:FuzzSplit:100000x
# Debian packages the tests need; installed by test/scripts/ensure-packages.sh when missing.
TEST_PACKAGES := kmod gcc openssl
# Debian packages `make test-vm` needs besides the kernel, which it downloads into bin/vm-cache/.
VM_TEST_PACKAGES := qemu-system-x86 kmod
# Debian packages of `make e2e`: the real node's (docs/e2e.md), and gcc and kmod for its kmod images.
E2E_PACKAGES := containerd runc containernetworking-plugins iptables conntrack kmod gcc
# The e2e cluster's folder; a failed run keeps its logs in bin/e2e/failed-<time>.
E2E_DIR := $(BIN)/e2e/run
# Which e2e tests run (go test -run).
E2E_RUN ?= .

##@ General

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z0-9_-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Demo

.PHONY: demo
demo: tools packages ## Run kmm end to end on a local control plane: load, reboot, kernel upgrade, ordered upgrade, deletion.
	@echo ">> building the worker and kubectl-kmm"
	CGO_ENABLED=0 go build -o $(BIN)/worker ./cmd/worker
	go build -o $(BIN)/kubectl-kmm ./cmd/kubectl-kmm
	go run ./test/demo/kmm-demo --worker $(BIN)/worker --kubectl-kmm $(BIN)/kubectl-kmm

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) $(KUSTOMIZE) ## Generate CRDs, RBAC and webhook configuration into config/, and from there into the Helm chart.
	$(CONTROLLER_GEN) crd rbac:roleName=kmm-manager-role webhook paths=./... \
		output:crd:artifacts:config=config/crd/bases \
		output:rbac:artifacts:config=config/rbac \
		output:webhook:artifacts:config=config/webhook
	$(MAKE) chart

# The chart's CRDs (crds/), manager Role and ClusterRole and webhook configuration
# (templates/generated-*.yaml) come from controller-gen's output as config/default renders it.
.PHONY: chart
chart: $(KUSTOMIZE) ## Generate the Helm chart's CRDs, RBAC and webhook configuration from config/ (part of make manifests).
	$(KUSTOMIZE) build config/default | go run ./hack/kmm-chart charts/kmm

# The OLM bundle (bundle/): a ClusterServiceVersion from config/default, validated with
# operator-framework's validation library (hack/kmm-bundle, a module of its own: docs/install.md).
.PHONY: bundle
bundle: $(KUSTOMIZE) ## Generate the OLM bundle into bundle/ from config/ and validate it with operator-framework/api.
	$(KUSTOMIZE) build config/default | (cd hack/kmm-bundle && go run . generate $(CURDIR)/bundle)
	cd hack/kmm-bundle && go run . validate $(CURDIR)/bundle

.PHONY: diagrams
diagrams: ## Generate docs/state-diagrams/ from the state machine configuration.
	go run ./hack/kmm-diagrams docs/state-diagrams

.PHONY: fmt
fmt: ## Run gofmt.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (built from the Go module proxy).
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...

.PHONY: test
test: tools packages ## Run all tests: unit, property (RAPID_CHECKS interleavings), fuzz seeds and envtest integration tests.
	@echo ">> property tests: $(RAPID_CHECKS) interleavings, RAPID_SEED=$(RAPID_SEED) (replay a failure with make test RAPID_SEED=$(RAPID_SEED))"
	RAPID_CHECKS=$(RAPID_CHECKS) RAPID_SEED=$(RAPID_SEED) go test $(GO_TEST_FLAGS) ./...
	cd hack/kmm-bundle && go test $(GO_TEST_FLAGS) ./...

.PHONY: test-vm
test-vm: ## Boot a Debian kernel under qemu (TCG) and check that the real worker loads and unloads real modules in it (test/vm).
	@test/scripts/ensure-packages.sh $(VM_TEST_PACKAGES)
	go test -tags vm -count=1 -v ./test/vm/

# The trap undoes the cluster's host side effects when the test dies without its own teardown (a
# `go test -timeout` panic runs no deferred function); after a clean teardown it finds nothing to do.
# TestKMM runs `make images` for this machine's platform itself and installs with bin/kustomize;
# TestBuild builds the builder image (BuildKit from Go source: minutes on a cold Go cache), hence 20m.
.PHONY: e2e
e2e: $(CONTROL_PLANE) $(BIN)/kubelet $(KUSTOMIZE) ## Run kmm from its own images, installed from config/, on a real node (kubelet, containerd, runc) of a local control plane (test/e2e, as root; docs/e2e.md).
	@test/scripts/ensure-packages.sh $(E2E_PACKAGES)
	go build -o $(BIN)/e2e-cleanup ./test/e2e/cleanup
	trap '$(BIN)/e2e-cleanup $(E2E_DIR)' EXIT; go test -tags e2e -count=1 -timeout 20m -v -run '$(E2E_RUN)' ./test/e2e/

# The qemu guest joined as a second node: real modules loaded by kmm's worker pods into a Debian
# kernel (docs/e2e.md). A separate run (its own cluster): kmm is installed without dry-run there.
.PHONY: e2e-kernel
e2e-kernel: $(CONTROL_PLANE) $(BIN)/kubelet $(KUSTOMIZE) ## Join a qemu guest (Debian kernel, TCG) as a second real node and have kmm's worker pods load real modules into it (test/e2e TestKernel, as root; docs/e2e.md).
	@test/scripts/ensure-packages.sh $(E2E_PACKAGES) $(VM_TEST_PACKAGES) make
	go build -o $(BIN)/e2e-cleanup ./test/e2e/cleanup
	trap '$(BIN)/e2e-cleanup $(E2E_DIR)' EXIT; go test -tags e2e,e2ekernel -count=1 -timeout 30m -v -run '^TestKernel$$' ./test/e2e/

# Depth of `make explore`: every interleaving of the fsm model's actions up to DEPTH steps from each
# starting world (docs/evidence.md gives the states and the time per depth).
DEPTH ?= 4

.PHONY: explore
explore: ## Explore every interleaving of the fsm model to DEPTH steps: print the state counts, write docs/exploration.md; the image machine's to 8 events.
	go test ./fsm -count=1 -timeout 30m -run '^TestExplore$$' -v -explore.depth=$(DEPTH) -explore.report=$(CURDIR)/docs/exploration.md
	go test ./image -count=1 -timeout 10m -run '^TestExplore$$' -v -image.depth=8

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZ_TIME each (or the count its entry gives).
	@for t in $(FUZZ_TARGETS); do pkg=$$(echo $$t | cut -d: -f1); name=$$(echo $$t | cut -d: -f2); \
		time=$$(echo $$t | cut -d: -f3); time=$${time:-$(FUZZ_TIME)}; \
		echo ">> fuzzing $$name in $$pkg for $$time"; \
		go test -run '^$$' -fuzz "^$$name\$$" -fuzztime $$time $$pkg || exit 1; \
		if [ "$(FUZZ_KEEP)" = 1 ]; then test/scripts/keep-fuzz-corpus.sh $$pkg $$name; fi; done

.PHONY: bench
bench: ## Run the Go benchmarks (benchstat-friendly: BENCH_COUNT runs each).
	go test -run '^$$' -bench . -benchmem -count $${BENCH_COUNT:-6} ./fsm/ ./worker/ ./controllers/node/ ./internal/semantic/ ./cmd/manager/app/ ./upgrade/

# Size of `make bench-scale`: simulated nodes and Modules.
NODES ?= 1000
MODULES ?= 3
# Extra flags for bench-scale's harness (e.g. --profile-seconds 30, --operator-args "--nmc-concurrency 32").
SCALE_FLAGS ?=

.PHONY: bench-scale
bench-scale: tools ## Scale harness (test/scale): NODES simulated nodes x MODULES Modules; writes bin/scale/result-NODESxMODULES.json.
	CGO_ENABLED=0 go build -o $(BIN)/manager ./cmd/manager
	go build -o $(BIN)/kmm-scale ./test/scale/kmm-scale
	$(BIN)/kmm-scale --nodes $(NODES) --modules $(MODULES) --manager $(BIN)/manager --out $(BIN)/scale $(SCALE_FLAGS)

# `make bench-busy` (issue 41, item 3): BUSY_NODES nodes x 1 Module, first in an empty cluster, then
# in a busy one (real-looking nodes renewing Leases and posting status, 30 unrelated pods a node with
# churn); extra harness flags in BUSY_FLAGS (e.g. --busy-idle 120s --status-period 10s).
BUSY_NODES ?= 1000
BUSY_FLAGS ?=

.PHONY: bench-busy
bench-busy: tools ## Busy-cluster harness (test/scale --busy): idle operator cost and a new Module's load, busy against empty; writes bin/scale/busy/.
	CGO_ENABLED=0 go build -o $(BIN)/manager ./cmd/manager
	go build -o $(BIN)/kmm-scale ./test/scale/kmm-scale
	$(BIN)/kmm-scale --nodes $(BUSY_NODES) --modules 1 --busy --manager $(BIN)/manager --out $(BIN)/scale/busy $(BUSY_FLAGS)

# `make chaos` (test/chaos): how long faults are injected, the seed, and extra test flags
# (e.g. CHAOS_FLAGS="-chaos.nodes=6 -chaos.modules=2 -chaos.out=/tmp/chaos").
CHAOS_DURATION ?= 7m
CHAOS_SEED ?= 1
CHAOS_FLAGS ?=

# `make chaos-catch-rate`: each seeded bug with BUG_SEEDS seeds from CHAOS_SEED; fails when a bug is
# caught with fewer than 9 in 10 of them (docs/reliability.md, "Seeded bugs": about an hour).
BUG_SEEDS ?= 10

.PHONY: chaos-catch-rate
chaos-catch-rate: tools ## Measure each seeded chaos bug's catch rate over BUG_SEEDS seeds (test/chaos; about an hour).
	go test -tags chaos -count=1 -timeout 180m -v -run '^TestSeededBugs$$' ./test/chaos/ -args -chaos.seed=$(CHAOS_SEED) -chaos.bug-seeds=$(BUG_SEEDS) $(CHAOS_FLAGS)

.PHONY: chaos
chaos: tools ## Fault injection (test/chaos): manager kills, partitions, kube-apiserver and etcd restarts, proxy faults; prints the report (docs/reliability.md).
	go test -tags chaos -count=1 -timeout 45m -v ./test/chaos/ -args -chaos.duration=$(CHAOS_DURATION) -chaos.seed=$(CHAOS_SEED) $(CHAOS_FLAGS)

.PHONY: verify
verify: generate manifests bundle diagrams fmt ## Regenerate everything and fail if the tree changed; then vet and lint.
	@if [ -n "$$(git status --porcelain)" ]; then \
		echo "make verify: generated files or formatting are stale; commit the result of 'make generate manifests bundle diagrams fmt':"; \
		git status --porcelain; git --no-pager diff --stat; exit 1; fi
	$(MAKE) vet lint

##@ Build

.PHONY: build
build: ## Build the operator binaries into bin/.
	CGO_ENABLED=0 go build -o $(BIN)/manager ./cmd/manager

# `make images` and `make push-images` (hack/images, docs/images.md). Names and tag of the images;
# the layouts are bin/images/kmm-manager and bin/images/kmm-worker whatever the names.
IMAGE_TAG ?= dev
MANAGER_IMAGE ?= kmm-manager
WORKER_IMAGE ?= kmm-worker
BUILDER_IMAGE ?= kmm-builder
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
# Time of every file and config in the images: the last commit's, so that two builds of one commit
# give the same digests.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
# Where push-images pushes, host[:port] (plain HTTP for localhost and 127.0.0.1).
REGISTRY ?=
ifneq ($(filter push-images push-builder-image,$(MAKECMDGOALS)),)
ifeq ($(REGISTRY),)
$(error make $(filter push-images push-builder-image,$(MAKECMDGOALS)): set REGISTRY=host:port)
endif
endif

.PHONY: images
images: ## Build both images as OCI layouts in bin/images/ (IMAGE_PLATFORMS); calls no Docker engine, only go, apt-get download and dpkg-deb.
	go run ./hack/images build --out $(BIN)/images --cache $(BIN)/images/cache --platforms $(IMAGE_PLATFORMS) \
		--epoch $(SOURCE_DATE_EPOCH) --tag $(IMAGE_TAG)

.PHONY: push-images
push-images: images ## Push both images to REGISTRY=host:port as MANAGER_IMAGE:IMAGE_TAG and WORKER_IMAGE:IMAGE_TAG.
	go run ./hack/images push --layout $(BIN)/images/kmm-manager --ref $(REGISTRY)/$(MANAGER_IMAGE):$(IMAGE_TAG)
	go run ./hack/images push --layout $(BIN)/images/kmm-worker --ref $(REGISTRY)/$(WORKER_IMAGE):$(IMAGE_TAG)

# The builder image of in-cluster builds (BuildKit, runc; docs/images.md), apart from `make images`:
# its BuildKit build is the slow part (about 85 s per platform with a warm module cache).
.PHONY: builder-image
builder-image: ## Build the in-cluster build pod's image (kmm-builder: BuildKit, runc) as an OCI layout in bin/images/kmm-builder.
	go run ./hack/images builder --out $(BIN)/images --cache $(BIN)/images/cache --platforms $(IMAGE_PLATFORMS) \
		--epoch $(SOURCE_DATE_EPOCH) --tag $(IMAGE_TAG)

.PHONY: push-builder-image
push-builder-image: builder-image ## Push the builder image to REGISTRY=host:port as BUILDER_IMAGE:IMAGE_TAG.
	go run ./hack/images push --layout $(BIN)/images/kmm-builder --ref $(REGISTRY)/$(BUILDER_IMAGE):$(IMAGE_TAG)

.PHONY: docker-build
docker-build: ## Build the same two images with a Docker engine, from the Dockerfile (make images needs none).
	docker build --target manager -t $(MANAGER_IMAGE):$(IMAGE_TAG) .
	docker build --target worker -t $(WORKER_IMAGE):$(IMAGE_TAG) .

##@ Deployment

# The images `make deploy` installs: the operator's, and the worker's that the operator runs on
# the nodes (both set with `kustomize edit set image` on config/default). By default what
# `make push-images REGISTRY=...` pushed.
IMG ?= $(if $(REGISTRY),$(REGISTRY)/)$(or $(MANAGER_IMAGE),kmm-manager):$(or $(IMAGE_TAG),dev)
WORKER_IMG ?= $(if $(REGISTRY),$(REGISTRY)/)$(or $(WORKER_IMAGE),kmm-worker):$(or $(IMAGE_TAG),dev)

.PHONY: deploy
deploy: $(KUSTOMIZE) ## Install kmm (config/default with IMG and WORKER_IMG) into the cluster of $KUBECONFIG, server-side applied.
	go run ./test/install/kmm-deploy apply --kustomize $(KUSTOMIZE) --image kmm-manager=$(IMG) --image kmm-worker=$(WORKER_IMG) config/default

.PHONY: undeploy
undeploy: $(KUSTOMIZE) ## Remove kmm from the cluster of $KUBECONFIG, CRDs last; refuses while Modules exist (docs/install.md).
	go run ./test/install/kmm-deploy delete --kustomize $(KUSTOMIZE) config/default

##@ Tools

.PHONY: tools
tools: $(CONTROL_PLANE) $(CONTROLLER_GEN) $(KUSTOMIZE) $(HELM) ## Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, controller-gen, kustomize and helm into bin/ (once).

.PHONY: packages
packages: ## Install the Debian packages the tests need when missing.
	@test/scripts/ensure-packages.sh $(TEST_PACKAGES)

$(BIN)/etcd: $(TOOLS_MOD)
	@echo ">> building etcd into bin/ (first run only)"
	cd test/tools && go build -o $@ go.etcd.io/etcd/server/v3

$(BIN)/kube-%: $(TOOLS_MOD)
	@echo ">> building kube-$* into bin/ (first run only; kube-apiserver takes a few minutes on 2 cores)"
	cd test/tools && go build -o $@ k8s.io/kubernetes/cmd/kube-$*

$(BIN)/kubelet: $(TOOLS_MOD)
	@echo ">> building kubelet into bin/ (first run only; about 90 s on 2 cores)"
	cd test/tools && go build -o $@ k8s.io/kubernetes/cmd/kubelet

# helm from its own module (test/tools/helm): its dependencies stay out of the control plane's.
$(HELM): $(HELM_MOD)
	@echo ">> building helm into bin/ (first run only)"
	cd test/tools/helm && go build -o $@ helm.sh/helm/v4/cmd/helm

$(CONTROLLER_GEN):
	GOBIN=$(BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

$(KUSTOMIZE):
	@echo ">> building kustomize $(KUSTOMIZE_VERSION) into bin/ (first run only)"
	GOBIN=$(BIN) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

$(GOLANGCI_LINT):
	@echo ">> building golangci-lint $(GOLANGCI_LINT_VERSION) into bin/ (first run only)"
	GOBIN=$(BIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
