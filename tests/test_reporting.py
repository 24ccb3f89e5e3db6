"""The report's records: the timing log of the captures keeps its first and last records."""

from __future__ import annotations

from rewrite.reporting import TimingLog


def test_the_timing_log_keeps_the_first_and_the_last_records():
    log = TimingLog(keep=3)
    for i in range(10):
        log.add("chunk0", "export", i)
    assert len(log) == 10 and [t.seconds for t in log.records()] == [0, 1, 2, 7, 8, 9]
    assert [t.seconds for t in log.records(since=8)] == [8, 9]
    log.add("chunk0", "export", -1.0)  # a clock step backwards is no negative stage
    assert log.records(since=10)[0].seconds == 0
