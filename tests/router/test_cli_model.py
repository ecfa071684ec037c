"""`kvroute serve` finds (and converts) its model before anything starts: a missing or
unreadable GGUF is a clear error and exit code 2, without starting Ray."""

from router.cli import main


def test_a_missing_gguf_file_stops_serve_before_ray(tmp_path, capsys):
    missing = tmp_path / "nowhere.gguf"
    assert main(["serve", "--model", str(missing)]) == 2
    assert f"GGUF file '{missing}' does not exist" in capsys.readouterr().err


def test_a_file_that_is_not_gguf_is_named(tmp_path, capsys):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    assert main(["serve", "--model", str(junk), "--engine", "sim"]) == 2
    assert f"{junk}: not a readable GGUF file" in capsys.readouterr().err
