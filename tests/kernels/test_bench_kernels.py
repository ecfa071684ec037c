"""benchmarks/bench_kernels.py wires the Triton kernels as the engine does (interpreted on
CPU here, compiled on a GPU) and checks them against the reference in the same run."""

import pytest

from benchmarks import bench_kernels


def test_quick_run_measures_every_kernel_and_matches_the_reference():
    out = bench_kernels.main(["--quick", "--impl", "triton", "--repeats", "1"])
    assert out["impl"] == "triton"
    for key in ("copy_gb_s", "decode_gb_s", "decode_over_copy", "prefill_tflop_s",
                "write_kv_gb_s"):
        assert out[key] > 0, key
    assert out["decode_over_copy"] == pytest.approx(out["decode_gb_s"] / out["copy_gb_s"],
                                                    rel=1e-3)
    assert out["max_abs_err_decode"] < 1e-5
    assert out["max_abs_err_prefill"] < 1e-5


@pytest.mark.parametrize("argv", [["--prefill-tokens", "600", "--context", "512"],
                                  ["--num-heads", "6", "--num-kv-heads", "4"],
                                  ["--batch", "0"]])
def test_bad_sizes_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        bench_kernels.parse_args(argv)
    assert "error" in capsys.readouterr().err
