"""What a real cluster keeps to itself: the code its daemons run, its state, and
its users' files.

* ``mb policy set`` takes policy names only: a ``module:callable`` is refused and
  never run; a policy that raises leaves the previous one scheduling.
* ``state/`` and the database are the owner's alone; ``run/`` and ``spool/``
  stay usable by every user (and an existing cluster's modes are fixed).
* A job's output files and processes get the submitter's umask.

(Other users' view of a job is in test_cluster_identity.py: it needs root.)
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from conftest import ClusterFactory, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

POLICIES = '''
from minibatch.policy.fifo import Fifo


class AlwaysBoom(Fifo):
    def plan(self, snap):
        raise RuntimeError("always boom")


class PendingBoom(Fifo):
    """Fine while nothing waits: it passes the server's trial on an empty queue."""

    def plan(self, snap):
        if snap.pending:
            raise RuntimeError("boom with jobs waiting")
        return super().plan(snap)
'''


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_module_callable_is_refused_and_never_run(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    witness = c.work / "owned"
    refused = c.run(
        "mb",
        "policy",
        "set",
        "os:system",
        "--param",
        f"command=touch {witness}",
        check=False,
    )
    assert refused.returncode == 1, refused
    assert "policies are chosen by name" in refused.stderr
    assert "[scheduler.policy_modules]" in refused.stderr
    assert not witness.exists()
    assert "policy:     easy" in c.run("mb", "policy", "show").stdout
    job = c.qsub("--", "true")
    c.wait_state(job, "completed")
    assert not witness.exists()


def test_a_policy_that_raises_leaves_the_previous_one_scheduling(
    cluster: ClusterFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "mbtestpolicies.py").write_text(POLICIES)
    monkeypatch.setenv("PYTHONPATH", str(mods))  # the daemons inherit it
    c = cluster(
        nodes=1,
        scheduler={
            "interval": 1.0,
            "policy_modules": {
                "alwaysboom": "mbtestpolicies:AlwaysBoom",
                "pendingboom": "mbtestpolicies:PendingBoom",
            },
        },
    )
    # The server plans the queue with it once before accepting it.
    bad = c.run("mb", "policy", "set", "alwaysboom", check=False)
    assert bad.returncode == 1, bad
    assert "'alwaysboom' failed to plan the current queue" in bad.stderr
    assert "RuntimeError: always boom" in bad.stderr and "keeping easy" in bad.stderr
    assert "policy:     easy" in c.run("mb", "policy", "show").stdout

    # This one passes that trial, and raises at the scheduler's first real pass.
    assert (
        "policy set to pendingboom"
        in c.run("mb", "policy", "set", "pendingboom").stdout
    )
    first = c.qsub("--", "true")
    c.wait_state(first, "completed")

    def refusal() -> str:
        shown = c.run("mb", "policy", "show").stdout
        return shown if "refused:" in shown else ""

    shown = wait_for(refusal, what="the refusal in mb policy show")
    assert (
        "refused:    pendingboom: it failed to plan (RuntimeError: boom with jobs "
        "waiting); running easy"
    ) in shown, shown
    assert "scheduler:  easy" in shown
    assert "policy pendingboom refused: it failed to plan" in c.log("scheduler")
    second = c.qsub("--", "true")  # and easy goes on scheduling
    c.wait_state(second, "completed")


def test_state_is_private_and_the_rest_usable_by_all(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, start=False)
    # An existing cluster made before these modes: fixed at the next start.
    state = c.home / "state"
    state.mkdir(mode=0o755)
    (state / "minibatch.db").touch(mode=0o644)
    c.home.chmod(0o700)
    c.up()
    assert mode(state) == 0o700
    db = c.paths.database
    assert mode(db) == 0o600 and db.stat().st_size > 0
    assert all(mode(p) == 0o600 for p in state.glob("minibatch.db-*"))  # WAL
    assert mode(c.paths.spool) == 0o711 and mode(c.paths.run) == 0o755
    assert mode(c.home) & 0o111 == 0o111  # traversable to run/ and spool/
    assert mode(c.paths.mqtt_credentials) == 0o600


def test_output_files_and_processes_get_the_submitters_umask(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1)
    cases = [
        (0o077, (), 0o600, "0077"),
        (0o002, (), 0o664, "0002"),
        (0o077, ("-W", "umask=022"), 0o644, "0022"),  # -W umask= wins
    ]
    for umask, extra, want, printed in cases:
        made = f"made{umask:o}{len(extra)}"
        job = c.qsub(
            *extra,
            "-N",
            made,
            "--",
            "sh",
            "-c",
            f"umask; touch {made}",
            umask=umask,
        )
        record = c.wait_state(job, "completed")
        out = Path(record["output_path"])
        assert mode(out) == want, (umask, extra, oct(mode(out)))
        assert out.read_text().strip() == printed
        assert mode(c.work / made) == want  # 0666 less the job's umask
