# The README's two commands: `make demo` (set up, run the job on the embedded stack, show
# results) and `make test` (set up, lint, type-check, run every test). Set-up is idempotent.
.PHONY: setup demo test lint
VENV := .venv/bin

setup:
	bash infra/setup.sh

demo: setup
	$(VENV)/adattr demo

lint: setup
	$(VENV)/ruff check app pipelines schemas tests infra/bench
	$(VENV)/ruff format --check app pipelines schemas tests infra/bench
	$(VENV)/mypy app pipelines schemas

test: lint
	$(VENV)/pytest
