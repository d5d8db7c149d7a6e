# The README's Quick start: `make up` runs dranet on this host, `make test` runs every check.
.PHONY: setup up test lint typecheck unit proto clean

setup:
	./.ci/setup

proto: setup

up: setup
	.venv/bin/python -m services.devcluster up

lint: setup
	.venv/bin/ruff check services shared tests
	.venv/bin/ruff format --check services shared tests

typecheck: setup
	.venv/bin/mypy services shared

test: setup
	.venv/bin/ruff check services shared tests
	.venv/bin/ruff format --check services shared tests
	.venv/bin/mypy services shared
	.venv/bin/python -m pytest tests -q

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
	find proto -name '*_pb2*.py*' -delete
