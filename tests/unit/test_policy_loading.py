"""Which code a policy choice may load, and what happens when a policy fails.

Only names are chosen over the socket (installed policies, or those the
configuration maps to ``module:callable``); a policy that fails to load or to
plan leaves the previous one in force and says why.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from minibatch.config import Config, Paths, SchedulerConfig, load
from minibatch.core.snapshot import ClusterSnapshot, Plan
from minibatch.errors import InvalidArgument, PermissionDenied
from minibatch.policy import registry
from minibatch.policy.fifo import Fifo
from minibatch.protocol.messages import GetPolicy, PolicyInfo, SetPolicy
from minibatch.scheduler.service import Scheduler
from minibatch.server import admin, booking
from minibatch.server.access import Context
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.server.submit import Caller
from tests.conftest import Clock, snapshot

ROOT = Caller(uid=0, gid=0, pid=1)
MODULES = {"boom": f"{__name__}:Boom", "mine": "minibatch.policy.fifo:Fifo"}


class Boom(Fifo):
    """Loads, then raises at every plan."""

    def plan(self, snap: ClusterSnapshot) -> Plan:
        raise RuntimeError("boom")


def test_a_module_callable_is_refused_by_name_and_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    witness = tmp_path / "imported"
    (tmp_path / "evilmod.py").write_text(
        f"open({str(witness)!r}, 'w').close()\nclass P: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidArgument, match=r"\[scheduler.policy_modules\]"):
        registry.load_named("evilmod:P")
    with pytest.raises(InvalidArgument, match="mb policy set mine"):
        registry.load_named("os:system", {"command": f"touch {witness}"})
    assert not witness.exists() and "evilmod" not in sys.modules


def test_the_configuration_names_policies_besides_the_installed_ones() -> None:
    assert isinstance(registry.load_named("MINE", {}, MODULES), Fifo)
    assert {"boom", "mine", "easy"} <= set(registry.available(MODULES))
    with pytest.raises(InvalidArgument, match="unknown policy 'mine'"):
        registry.load_named("mine")


def test_configured_names_must_map_to_a_module_callable(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    paths.config.write_text('[scheduler.policy_modules]\nmine = "no.colon"\n')
    with pytest.raises(InvalidArgument, match='NAME = "module:callable"'):
        load(paths)


def _state(tmp_path: Path, config: Config | None = None) -> ServerState:
    return ServerState(Store(tmp_path / "db.sqlite"), Clock(), config)


def test_a_client_may_not_name_a_module_callable(tmp_path: Path) -> None:
    state = _state(tmp_path)
    ctx = Context(policy_modules=MODULES)
    msg = SetPolicy(name="os:system", params={"command": "id"})
    with pytest.raises(PermissionDenied, match="chosen by name"):
        admin.set_policy(state, ctx, ROOT, b"", msg)
    assert state.policy.name == "easy" and state.store.setting("policy") is None
    # By its configured name the same code is fine.
    admin.set_policy(state, ctx, ROOT, b"", SetPolicy(name="mine"))
    assert state.policy.name == "mine"


def test_a_policy_that_raises_is_refused_and_the_previous_one_stays(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    ctx = Context(policy_modules=MODULES)
    with pytest.raises(InvalidArgument, match=r"'boom' failed to plan.*keeping easy"):
        admin.set_policy(state, ctx, ROOT, b"", SetPolicy(name="boom"))
    assert state.policy.name == "easy" and not state.events


def test_a_stored_choice_no_longer_allowed_is_not_loaded(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    config = Config(scheduler=SchedulerConfig(policy_modules=MODULES))
    for name in ("os:system", "mine"):
        store.put_setting("policy", {"name": name, "params": {}, "set_by": "x"})
        store.commit()
        # "mine" is gone from this configuration: the default is used.
        assert booking.load_policy(store, Config()).name == "easy"
    assert booking.load_policy(store, config).name == "mine"
    store.close()


@pytest.fixture
def sched() -> Iterator[Scheduler]:
    """A scheduler that never reaches a server: only its policy logic runs."""
    s = Scheduler(
        "ipc:///nonexistent/mb-test.sock",
        registry.load("easy"),
        "easy",
        10.0,
        modules=MODULES,
    )
    yield s
    asyncio.run(s.client.close())


def test_the_scheduler_goes_back_to_the_previous_policy_when_one_raises(
    sched: Scheduler,
) -> None:
    sched.switch("boom", {})
    assert sched.policy_label == "boom"
    snap = snapshot([1], pending=[(1, 1, 60.0)])
    plan = sched.plan(snap)
    assert [s.job for s in plan.starts] == [1]  # easy's plan
    assert sched.policy_label == "easy"
    assert sched.refused_why.startswith("boom: it failed to plan (RuntimeError")
    sched.switch("boom", {})  # named again by the next wake: not retried
    assert sched.policy_label == "easy"
    sched.switch("fifo", {})  # another choice is taken, and clears the refusal
    assert (sched.policy_label, sched.refused_why) == ("fifo", "")


def test_the_scheduler_loads_names_only_and_says_why_it_refused(
    sched: Scheduler,
) -> None:
    sched.switch("os:system", {"command": "id"})
    assert sched.policy_label == "easy"
    assert sched.refused_why.startswith("os:system: cannot load it (policies are")


def test_policy_show_reports_the_schedulers_refusal(tmp_path: Path) -> None:
    state = _state(tmp_path)
    ctx = Context(policy_modules=MODULES)
    admin.set_policy(state, ctx, ROOT, b"", SetPolicy(name="mine"))
    state.policy_name, state.policy_refused = "easy", "mine: it failed; running easy"
    info = admin.get_policy(state, ctx, ROOT, b"", GetPolicy())
    assert isinstance(info, PolicyInfo)
    assert info.scheduler_refused == "mine: it failed; running easy"
    assert "mine" in info.available
    state.policy_refused = "other: it failed; running easy"  # not the choice now
    info = admin.get_policy(state, ctx, ROOT, b"", GetPolicy())
    assert isinstance(info, PolicyInfo) and info.scheduler_refused == ""
