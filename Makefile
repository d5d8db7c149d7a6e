# The README's Quick start: `make up` runs dranet on this host, `make test` runs every check.
.PHONY: setup up test lint typecheck unit proto clean

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

test: setup
	.venv/bin/ruff check services shared dev tests
	.venv/bin/ruff format --check services shared dev tests
	.venv/bin/mypy services shared dev
	.venv/bin/python -m pytest tests -q

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
	find proto -name '*_pb2*.py*' -delete
