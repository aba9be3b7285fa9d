"""What the sink tells its observers after each micro-batch (the benchmark, the job's metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    # Per record outcome (accepted, duplicate, late, each quarantine reason): they add up to
    # ``read``. The ledger row's ``counts`` hold the same, plus what the batch derived.
    outcomes: dict[str, int]
    steps: dict[str, float]  # wall time per phase, seconds
    kafka_outcome: str  # the ledger's: committed:<n>, already-committed, nothing-to-publish...
    # Per (topic, partition) the batch read: its newest offset and that record's Kafka
    # timestamp (epoch ms).
    newest: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    finished_at: float = 0.0  # epoch seconds, when the ledger row was written

    @property
    def records(self) -> int:
        return sum(self.outcomes.values())
