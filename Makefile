# The README's two commands: `make demo` (set up, run the job on the embedded stack, show
# results) and `make test` (set up, lint, type-check, scan for secrets, run every test).
# Set-up is idempotent.
.PHONY: setup deps archive demo test lint scan
VENV := .venv/bin

setup: deps archive

# The packages, the jars and adattr's own JVM classes: what lint, scan and the archive need.
deps:
	bash infra/setup.sh --no-archive

# The driver's class-data archive: a ~40 s training run, once per JDK and jar set.
archive: deps
	$(VENV)/python -m app.runtime.jvm_archive

demo: setup
	$(VENV)/adattr demo

lint: deps
	$(VENV)/ruff check app pipelines schemas tests infra/bench
	$(VENV)/ruff format --check app pipelines schemas tests infra/bench
	$(VENV)/mypy app pipelines schemas infra/bench
	$(VENV)/lint-imports

# Every tracked file, scanned for keys, tokens and passwords (detect-secrets' detectors); a test
# value that looks like one is marked with detect-secrets' allowlist pragma, saying why.
scan: deps
	git ls-files -z | xargs -0 $(VENV)/detect-secrets-hook

# Lint, the scan and the archive's training run side by side (they share no file; the training
# run is ~40 s of JVM the two cores otherwise run alone), then every test.
test: deps
	$(MAKE) --no-print-directory -j3 --output-sync=target lint scan archive
	$(VENV)/pytest -n 2
