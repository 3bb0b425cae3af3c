"""The benchmarks refuse bad numbers before they start anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minibatch.bench import curve
from minibatch.errors import InvalidArgument

MB = Path(sys.executable).with_name("mb")


def test_curve_depths_are_positive_integers() -> None:
    assert curve.parse_depths("1000,10000, 100000") == [1000, 10000, 100000]
    for bad in ("abc", ",,", "0", "-5", "10,", "1e3"):
        with pytest.raises(InvalidArgument, match="--curve"):
            curve.parse_depths(bad)


@pytest.mark.parametrize(
    "args",
    [
        ["throughput", "--jobs", "0"],
        ["throughput", "--repeat", "0"],
        ["commands", "--runs", "0"],
        ["load", "--runs", "0", "--curve", "10"],
        ["load", "--curve", "abc"],
        ["scheduler", "--repeat", "0"],
        ["sim", "--repeat", "0"],
    ],
)
def test_bad_numbers_are_one_error_and_start_nothing(
    args: list[str], tmp_path: Path
) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("MB_HOME", None)
    proc = subprocess.run(
        [str(MB), "bench", *args], capture_output=True, text=True, env=env, timeout=30
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no cluster home was made
