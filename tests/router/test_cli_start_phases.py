"""`kvroute serve` prints how long each phase of its start took, in one line once up, and
bench_real_model.py reads that line back."""

from benchmarks.serve_start import start_phases
from router import cli


def test_phases_line_names_each_phase_and_the_total(monkeypatch, tmp_path):
    clock = iter([100.0, 101.25, 101.5, 105.0, 107.0, 120.04])
    monkeypatch.setattr(cli.time, "monotonic", lambda: next(clock))
    phases = cli.StartPhases()
    for name in ("imports", "model found", "ray", "serve", "app"):
        phases.done(name)
    line = f"kvroute: {phases.summary()}"
    assert line == ("kvroute: up in 20.0 s (imports 1.2 s, model found 0.2 s, ray 3.5 s, "
                    "serve 2.0 s, app 13.0 s)")
    log = tmp_path / "serve.log"
    log.write_text(f"Started a local Ray instance.\n\n{line}\nkvroute: serving 'smollm2'\n")
    assert start_phases(log) == {"imports": 1.2, "model found": 0.2, "ray": 3.5,
                                 "serve": 2.0, "app": 13.0}


def test_a_log_without_the_line_has_no_phases(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("kvroute serve: model 'x' does not exist\n")
    assert start_phases(log) == {}
