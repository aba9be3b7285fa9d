"""The Spark logic: pure transforms, the streaming query's wiring, and the idempotent sinks."""
