"""The budget service downstream of the job: it reads the published gold rows (read_committed)
into a database, exactly once, and raises budget alerts. Needs only the runtime and the
contracts."""
