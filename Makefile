# The README's Quick start: `make up` runs dranet on this host, `make test` runs every check.
.PHONY: setup up test test-next lint typecheck unit proto clean

setup:
	./.ci/setup

proto: setup

# A real single-node Kubernetes and dranet's four services on this host; a demo Pod
# gets a NIC once everything is ready. Ctrl-C stops it all. UP_ARGS adds flags.
up: setup
	.venv/bin/python -m dev.cluster up --demo $(UP_ARGS)

lint: setup
	.venv/bin/ruff check services shared dev tests
	.venv/bin/ruff format --check services shared dev tests

typecheck: setup
	.venv/bin/mypy services shared dev

# The real-cluster tier again on the second pinned Kubernetes version (KUBE_VERSION_NEXT in
# dev/versions.env, built by .ci/setup): `make test` ends with it, `make test-next` runs it alone.
# Every `cluster` test but those whose subject does not change with the Kubernetes version (the
# churn soak, helm upgrade, `make up`'s second cluster, config fuzzing, compose, DHCP, GCE
# metadata, the differential tests against dranet), to keep CI within its time: about 11 min
# here instead of 14 (and the churn's run).
KUBE_NEXT := $(shell sed -n 's/^KUBE_VERSION_NEXT=//p' dev/versions.env)
NEXT_SKIP = tests/e2e/test_churn.py tests/e2e/test_upgrade.py tests/e2e/test_make_up.py \
	tests/e2e/test_config_fuzz.py tests/e2e/test_compose.py tests/integration/dhcp \
	tests/e2e/test_prepare_gce.py tests/e2e/test_vs_dranet.py
NEXT_TESTS ?= tests -m cluster $(addprefix --ignore=,$(NEXT_SKIP))
NEXT_TIER = DRANET_KUBE_VERSION=$(KUBE_NEXT) .venv/bin/python -m pytest $(NEXT_TESTS) -q

test: setup
	.venv/bin/ruff check services shared dev tests
	.venv/bin/ruff format --check services shared dev tests
	.venv/bin/mypy services shared dev
	.venv/bin/python -m pytest tests -q
	$(NEXT_TIER)

test-next: setup
	$(NEXT_TIER)

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
	find proto -name '*_pb2*.py*' -delete
