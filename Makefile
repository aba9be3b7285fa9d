# The README's two commands: `make demo` (set up, run the job on the embedded stack, show
# results) and `make test` (set up, lint, type-check, scan for secrets, run every test).
# Set-up is idempotent.
.PHONY: setup demo test lint scan
VENV := .venv/bin

setup:
	bash infra/setup.sh

demo: setup
	$(VENV)/adattr demo

lint: setup
	$(VENV)/ruff check app pipelines schemas tests infra/bench
	$(VENV)/ruff format --check app pipelines schemas tests infra/bench
	$(VENV)/mypy app pipelines schemas infra/bench
	$(VENV)/lint-imports

# Every tracked file, scanned for keys, tokens and passwords (detect-secrets' detectors); a test
# value that looks like one is marked with detect-secrets' allowlist pragma, saying why.
scan: setup
	git ls-files -z | xargs -0 $(VENV)/detect-secrets-hook

test: lint scan
	$(VENV)/pytest
