"""Torque's ``-t`` on qdel, qhold and qrls: some tasks of an array."""

from __future__ import annotations

import pytest

from minibatch.cli.jobctl import array_tasks


def test_array_ids_become_the_tasks_named() -> None:
    ids = array_tasks("qdel", ["7[]", "8", " 9[2]"], "1-2,5")
    assert ids == ["7[1]", "7[2]", "7[5]", "8[1]", "8[2]", "8[5]", " 9[2]"]
    assert array_tasks("qdel", ["7[]"], None) == ["7[]"]


@pytest.mark.parametrize("bad", ["abc", "5-1", "1-3%2", ""])
def test_a_bad_range_is_one_line_and_exit_2(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        array_tasks("qdel", ["7[]"], bad)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("qdel: ") and err.count("\n") == 1
