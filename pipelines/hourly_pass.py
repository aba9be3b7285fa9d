"""When the gold tables no consumer waits for are brought up to date: the attributions and the
1-minute windows (``gold_attributions``, ``gold_ad_metrics_1m``, as tables) and the sliding
hours (``gold_campaign_ctr_1h``), not by every batch, by a *pass* every ``every`` batches, by a
run's first batch and its stop.

Why they may lag. The sliding hours are published to no one (``schemas.ad_metrics.PUBLISHED``:
the 1-minute windows and the attributions are) and are a pure function of the 1-minute table,
``campaign_ctr`` of its impressions and clicks. The 1-minute windows are published, but a batch
between passes publishes them from the windows it computed, not from the table
(``GoldUpdate._publish_minutes``: why that is exact), so a consumer of the topic sees every
change at once and only the table waits. The attributions likewise: a batch between passes
publishes the rows it computed and keeps them for the pass (``pipelines.pending_rows``:
why that is exact, and what a run's first pass re-attributes after a crash). A pass writes the
attribution rows kept since the last pass, then the 1-minute windows: those the batches since
the last pass published, kept too (a pass that keeps, ``HourlyPass.kept``, the usual one), or
every minute that a batch since the last pass changed recomputed from silver and the
attributions as they are then (a run's first pass, and one under a final end); then every hour
holding a changed minute, from the 1-minute table, and it finalises every row whose end the
watermark passed since then: the rows a MERGE in each of those batches would have left,
because each row is set from what it sums, never added to. So which batch passes changes when
the tables are up to date, never what they hold once they are; the two MERGEs cost a data
batch ~3-4 s (README "Performance"), and a pass of ``every`` batches costs about as much. A
pass that keeps writes after its batch's Kafka transaction, beside the next batch
(``pipelines.pass_beside``).

What a pass covers. A batch changes only minutes of its accepted events (a re-attributed
conversion changes the minute of its conversion, a pending one's, later than the watermark too),
each later than its watermark, so the batches since a pass changed minutes in the span of their
accepted events, all later than the watermark the pass was made at. Within a run that span is
kept here. A run does not know what the runs before it left undone (a crash between passes), so
its first batch passes over every row that can be behind: every minute of silver's events at or
after the latest end of a final 1-minute row (``HighWater.minutes_behind``), every hour ending
after the latest final hourly row, from the 1-minute rows at or after that end
(``HighWater.hours_behind``), and the attributions of silver's conversions at or after the
latest final one (``HighWater.conversions_behind``, ``pipelines.pending_rows``). That
holds while no batch that left its pass to a later one accepted an event in a final row, which
is why a batch may leave it only when its watermark is at or past the latest final end of the
three tables at the run's start (and of what its first pass writes final,
``HourlyPass.settled_ms``), and silver holds no event later than the watermark that the
generation never saw (``HighWater.silver_unseen``): its events are later, and so are those of
every batch after it. Within a generation the watermark is restored with the checkpoint, so that
always holds. A replay's (or a rewound checkpoint's) watermark starts at 0, below rows an
earlier generation made final, so its batches pass themselves, every time, as every batch did
before, until their watermark reaches that end.

What a crash between passes leaves published. The batches since the last pass published the
windows and attributions their watermark passed as final, which the tables do not hold yet. A
restart re-runs the crashed batch under its own watermark, so its first pass writes them final
again; a replay's starts at 0. So a run's first pass writes final every row it writes (and finalises
every 1-minute and hourly row not final yet) at or before the latest watermark a batch of any
generation was planned under (``HourlyPass.settled_ms``, from the offset logs: at or past every
watermark a batch published under), and its batches pass until their watermark reaches it:
nothing the topic carried final is published open again, as a MERGE in every batch, which
kept a final row final, never did. (The attributions are floored so when the pass
re-attributes conversions, ``HourlyPass.conversions``: only then can it write one.)

The stop. ``finish`` passes once the query has stopped between batches, so a table read after
a run (``verify``, ``reconcile``, a quality check) is up to date; a run that ends otherwise (a
crash) leaves it to the next run's first batch. (The names say "hourly": the passes were the
sliding hours' first, and ``ADATTR_HOURLY_EVERY`` keeps its name.)
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines import tables as t
from pipelines.high_water import NEVER
from pipelines.pending_rows import PendingRows

Span = tuple[int, int]


def union(a: Span | None, b: Span | None) -> Span | None:
    """The smallest span holding both (None: neither)."""
    return b if a is None else hull(a, b)


def hull(a: Span, b: Span | None) -> Span:
    """The smallest span holding ``a`` and ``b`` (None: ``a``)."""
    return a if b is None else (min(a[0], b[0]), max(a[1], b[1]))


@dataclass(frozen=True)
class HourlyPass:
    """What one pass does: write the attribution rows kept since the last pass, write the
    1-minute windows kept since then (``kept``) or recompute the minutes of ``pending``, and
    recompute the hours holding one of ``pending`` (event-time span, epoch ms; None: no
    minute changed since the last pass) and finalise the rows ending after ``since_ms`` (the
    watermark of the last pass; 0: every row not final yet) up to the batch's watermark (a
    run's first: up to ``settled_ms`` if later)."""

    since_ms: int
    pending: Span | None = None
    # The conversions (event-time span of silver's) whose attributions the pass recomputes
    # (a run's first: ``HighWater.conversions_behind``; None: none), and the latest watermark
    # a batch of any generation was planned under (``offset_log.latest_watermark``; a run's
    # first pass only): a row it writes at or before it was final to that batch, which may
    # have published it final, and is written final (attributions, 1-minute and hourly rows).
    conversions: Span | None = None
    settled_ms: int = NEVER
    # A pass of a run that has passed before, by a batch that could have left it to a later
    # one (so never when every batch passes, ``every`` 1: a MERGE in every batch): the batch
    # publishes what it computed and keeps it, as a batch between passes does,
    # and after its Kafka transaction writes the rows kept since the last pass
    # (``pipelines.pending_rows``), then the hours. Otherwise (a run's first pass, or a batch
    # whose events may fall in a final row) it recomputes the minutes from silver, MERGEs
    # before its transaction and publishes the rows stamped with it.
    kept: bool = False


class HourlyPasses:
    """The passes of one run: which batch passes, over what."""

    def __init__(
        self,
        every: int,
        behind: Span | None,
        final_ms: int,
        conversions: Span | None = None,
        settled_ms: int = NEVER,
    ) -> None:
        assert every >= 1, "a pass at least once in every `every` batches"
        self.every = every
        # The minutes this run's first pass must cover (``HighWater.minutes_behind``,
        # ``hours_behind``), the conversions it re-attributes (``conversions_behind``), and the
        # latest end of a final row of the three tables at the run's start, or of one that
        # pass writes final (``settled_ms``).
        self.behind = behind
        self.conversions = conversions
        self.settled_ms = settled_ms
        self.final_ms = max(final_ms, settled_ms)
        # The attribution rows and 1-minute windows the batches since the last pass set,
        # which it writes.
        self.attributions = PendingRows(t.ATTRIBUTIONS)
        self.minutes = PendingRows(t.GOLD_1M)
        self.since_batch = 0  # the first batch since the last pass
        self.passed = False  # whether this run has passed yet
        self.since_ms = 0  # the watermark of this run's last pass
        self.pending: Span | None = None  # accepted events' span since that pass
        self.last: tuple[int, int] | None = None  # (batch id, watermark) of the last batch

    def plan(self, batch_id: int, watermark_ms: int, *, own: bool) -> HourlyPass | None:
        """The pass batch ``batch_id`` (under ``watermark_ms``) makes; None when it leaves the
        table to a later batch. ``own``: whether silver holds no event later than the
        watermark that this generation never saw (``HighWater.silver_unseen`` false). A batch
        that may accept an event in an hour already final passes, so that a crash cannot leave
        such an hour behind where the next run's first pass does not look."""
        later = own and watermark_ms >= self.final_ms
        if self.passed and later and batch_id % self.every:
            return None
        return self._pass(kept=self.passed and later and self.every > 1)

    def done(
        self,
        batch_id: int,
        watermark_ms: int,
        span: Span | None,
        plan: HourlyPass | None,
        kept: PendingRows | None = None,
        minutes: PendingRows | None = None,
    ) -> None:
        """Batch ``batch_id`` (its accepted events' ``span``) has completed with ``plan``,
        keeping the attribution rows ``kept`` and the 1-minute windows ``minutes`` (those
        kept before it and its own: ``GoldUpdate.pending``, ``GoldUpdate.minutes``); or,
        after the stop, the stop's pass (``span`` None)."""
        self.last = (batch_id, watermark_ms)
        if plan is None:
            self.pending = union(self.pending, span)
            if kept is not None:
                self.attributions = kept
            if minutes is not None:
                self.minutes = minutes
            return
        self.passed, self.behind, self.pending, self.conversions = True, None, None, None
        self.since_ms = watermark_ms
        self.since_batch = batch_id + 1
        self.attributions.clear()
        self.minutes.clear()

    def at_stop(self) -> tuple[int, int, HourlyPass] | None:
        """The pass to make once the query has stopped: (batch id and watermark of the last
        batch, the pass); None when the table is up to date (or no batch ran)."""
        if self.last is None:
            return None
        batch_id, watermark_ms = self.last
        up_to_date = self.pending is None and not self.attributions and not self.minutes
        if self.passed and up_to_date and watermark_ms <= self.since_ms:
            return None
        # The batches since the last pass all left it to a later one: they kept their rows.
        return batch_id, watermark_ms, self._pass(kept=self.passed and self.every > 1)

    def _pass(self, *, kept: bool) -> HourlyPass:
        if not self.passed:  # a run's first: whatever earlier runs left behind, every due hour
            return HourlyPass(
                0, union(self.behind, self.pending), self.conversions, self.settled_ms
            )
        return HourlyPass(self.since_ms, self.pending, kept=kept)
