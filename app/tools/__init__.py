"""The operator's tools around the job: traffic and truth, verify, audit, reconcile, replay,
quality, the drills, the benchmark and the demo. They run the job (``pipelines``) on the local
stack and check what it wrote; the CLI calls them."""
