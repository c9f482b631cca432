"""The engine's cores in a cell, from its samples, by hand."""

from __future__ import annotations

from loadgen.results.enginecores import EngineCores, engine_cores
from loadgen.results.readings import EngineCoreReading, Hog, reading


def test_other_programs_share_is_what_named_processes_used() -> None:
    # two 1 s samples of cores 0-1 (2 core-seconds each): the engine used 0.6 s of each; "hog" 0.4
    # then 0.9 s, "cron" 0.1 s (what the cores were busy with besides, the kernel's, is no program's)
    samples = [
        EngineCoreReading(1.0, (0, 1), 1.0, 0.6, (Hog(9, "hog", 0.4),)),
        EngineCoreReading(1.0, (0, 1), 1.6, 0.6, (Hog(9, "hog", 0.9), Hog(7, "cron", 0.1))),
    ]
    ec = engine_cores(samples)
    assert ec is not None
    assert ec.engine_share == 0.3  # 1.2 of 4 core-seconds
    assert ec.others_share == 0.35  # (0.4 + 0.9 + 0.1) of 4
    assert ec.others == (Hog(9, "hog", 0.65), Hog(7, "cron", 0.05))  # each over the cell's 2 s
    assert ec.starved is True
    said = ec.warning()
    assert said is not None
    assert "took 35% of its cores 0,1 (hog (pid 9) 65% of a core, cron (pid 7) 5% of a core)" in said
    assert EngineCores.from_dict(ec.to_dict()) == ec


def test_a_quiet_core_is_not_starved_and_nothing_watched_is_none() -> None:
    # busy beyond the engine's own use (interrupts of the load itself), but no other program
    ec = engine_cores([EngineCoreReading(2.0, (3,), 0.9, 0.48)])
    assert ec is not None
    assert ec.starved is False
    assert ec.warning() is None
    assert engine_cores([]) is None


def test_a_reading_goes_through_probes_jsonl_unchanged() -> None:
    r = EngineCoreReading(1.0, (0,), 0.9, 0.2, (Hog(5, "x", 0.7),))
    assert reading("engine_cores", r.to_dict()) == r
