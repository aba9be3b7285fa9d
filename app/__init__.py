"""adattr around its job (``pipelines``): the runtime below it; the local stack, the operator's
tools, the budget service and the CLI above it. README, "Code map"."""
