"""gate bill and gate roofline: config-only bills equal the bytes gate check loads, the
budget statement, rules on bill lines and headroom, and the seed's roofline lab."""

from __future__ import annotations


import pytest
from click.testing import CliRunner

from gate.cli import cli
from gate.measure.roofline import attainable, predicted_speedup, ridge_batch, step


def test_the_seeds_roofline_lab():
    assert attainable(1000e9, 100e9, 2) == 200e9
    assert attainable(1000e9, 100e9, 10) == 1000e9
    result = CliRunner().invoke(cli, ["roofline", "--bandwidth", "100GB/s", "--peak", "1000GFLOP/s", "--intensity", "2", "--intensity", "10"])
    assert result.exit_code == 0
    assert "intensity 2 FLOP/byte -> attainable 200 GFLOP/s (bandwidth-bound)" in result.output
    assert "intensity 10 FLOP/byte -> attainable 1000 GFLOP/s (compute-bound)" in result.output


def test_verification_is_almost_free_while_bandwidth_bound():
    # 1B params at 2 bytes, tiny cache: batch 1 decode and a 5-token verification read the same bytes
    decode = step("decode", 10**9, 2 * 10**9, 0, 0, 1, 1, 1000e9, 100e9)
    verify = step("verify", 10**9, 2 * 10**9, 0, 0, 1, 5, 1000e9, 100e9)
    assert decode.bound == verify.bound == "bandwidth" and verify.time_s == pytest.approx(decode.time_s)
    # ridge: 2 * 1e9 * b * 5 / 2e9 = 10 FLOP/byte -> b = 2
    assert ridge_batch(10**9, 2 * 10**9, 0, 0, 5, 1000e9, 100e9) == pytest.approx(2.0)
    assert step("verify", 10**9, 2 * 10**9, 0, 0, 4, 5, 1000e9, 100e9).bound == "compute"
    # primer: alpha 0.8, gamma 4, c 0.1 -> (1 - 0.8^5) / (0.2 * 1.4)
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))


@pytest.mark.parametrize("args, words", [
    (["--bandwidth", "100", "--peak", "1000GFLOP/s"], "cannot read '100'"),
    (["--bandwidth", "100GB/s", "--peak", "1000GB/s"], "FLOP/s"),
])
def test_roofline_bad_units_are_usage_errors(args, words):
    result = CliRunner().invoke(cli, ["roofline", *args])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output


RESOURCES = "resources:\n  capacity: 2 MiB\n  sequences: 2\n  workspace: 64 KiB\n  fragmentation: 0.05\n"


