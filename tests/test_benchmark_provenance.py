"""A result file records the command that made it, options included (``harness/provenance.py``)."""

import sys

from harness.provenance import ROOT, command


def test_the_recorded_command_carries_the_options_it_ran_with(monkeypatch):
    script = ROOT / "benchmarks" / "search_latency.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--backend", "torch", "--out", "runs/a b.json"])
    assert command() == "python benchmarks/search_latency.py --backend torch --out 'runs/a b.json'"


def test_a_script_named_relative_to_the_root_is_recorded_the_same_way(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["benchmarks/soak.py", "--minutes", "10"])
    assert command() == "python benchmarks/soak.py --minutes 10"
