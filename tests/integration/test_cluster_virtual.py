"""Virtual CPUs: nodes with more CPUs than the machine has cores (``mb up
--oversubscribe``), each numbering its CPUs 0..N-1.

What is checked is what the operating system says: a job is told its virtual
CPUs (``MB_CPU_LIST``) and runs on the real cores behind them (its affinity and
its cpuset cgroup), before and after a resize; ``pbsnodes`` and ``mb status``
say the CPUs are virtual and which cores carry them.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import Cluster, ClusterFactory
from test_cluster_malleable import cgroup_cpus, thread_masks

from minibatch.cluster.layout import NodeLayout, from_config, usable_cpus
from minibatch.config import Config, NodeConfig
from minibatch.core.units import format_cpu_list, parse_cpu_list
from minibatch.errors import InvalidArgument
from minibatch.node.service import _parse, virtual_layout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CORES = usable_cpus()
#: Two nodes of at least 8 CPUs and at least as many as there are cores: more
#: CPUs than cores whatever the machine, so they are virtual.
PER_NODE = max(8, len(CORES))

#: What the job was told, and what the kernel lets it run on.
REPORT = textwrap.dedent(
    """
    import os
    print("told", os.environ["MB_CPU_LIST"], os.environ["MB_CPUS"])
    print("affinity", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    """
)

#: A malleable job: two spinning threads until killed.
SPIN = textwrap.dedent(
    """
    import threading
    def spin():
        while True:
            pass
    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
    threading.Event().wait()
    """
)


def virtual_cluster(cluster: ClusterFactory) -> Cluster:
    c = cluster(nodes=2, cpus_per_node=PER_NODE)
    for node in c.layout:
        assert node.cpus == list(range(PER_NODE)) and node.real_cpus
    return c


def cores_of(node: NodeLayout, cpus: list[int]) -> set[int]:
    """The real cores behind the virtual ``cpus`` of ``node``."""
    return {node.real_cpus[node.cpus.index(cpu)] for cpu in cpus}


def layout_of(c: Cluster, name: str) -> NodeLayout:
    found: list[NodeLayout] = [n for n in c.layout if n.name == name]
    assert len(found) == 1, found
    return found[0]


def test_a_job_is_told_its_virtual_cpus_and_runs_on_their_cores(
    cluster: ClusterFactory,
) -> None:
    c = virtual_cluster(cluster)
    jid = c.qsub("-N", "virt", "-l", "ncpus=4", "--", sys.executable, "-c", REPORT)
    record = c.wait_state(jid, "completed")
    out = dict(
        line.split(" ", 1)
        for line in (c.work / f"virt.o{jid}").read_text().split("\n")
        if line
    )
    told, count = out["told"].split()
    cpus = [int(x) for x in told.split(",")]
    assert count == "4" and cpus == record["cpus"]
    assert len(cpus) == 4 and set(cpus) <= set(range(PER_NODE))
    node = layout_of(c, record["node"])
    affinity = {int(x) for x in out["affinity"].split(",")}
    assert affinity == cores_of(node, cpus)
    # Consecutive CPUs are on distinct cores: as many as there can be.
    assert len(affinity) == min(4, len(CORES))
    full = c.run("qstat", "-f", jid).stdout
    assert f"exec_host = {'+'.join(f'{node.name}/{cpu}' for cpu in cpus)}" in full


def test_srun_runs_every_task_of_a_job_on_more_cpus_than_cores(
    cluster: ClusterFactory,
) -> None:
    """``sbatch -n 6 --wrap 'srun ...'`` where the job's 6 CPUs are virtual:
    all 6 tasks run, sharing the cores behind them (srun refused, counting
    cores; found by a new-user trial)."""
    c = virtual_cluster(cluster)
    srun = Path(sys.executable).with_name("srun")
    wrap = f"{srun} -l sh -c 'grep Cpus_allowed_list /proc/self/status'"
    jid = c.run("sbatch", "--parsable", "-n", "6", "-o", "six.out", "--wrap", wrap)
    c.wait_state(jid.stdout.strip(), "completed")
    lines = (c.work / "six.out").read_text().splitlines()
    assert sorted(line.split(":")[0] for line in lines) == [str(i) for i in range(6)]
    used = {int(line.rsplit("\t", 1)[-1]) for line in lines}
    assert used == set(CORES[:6]), lines


def test_pbsnodes_and_mb_status_say_the_cpus_are_virtual(
    cluster: ClusterFactory,
) -> None:
    c = virtual_cluster(cluster)
    nodes = json.loads(c.run("pbsnodes", "-a", "--json").stdout)
    assert [n["np"] for n in nodes] == [PER_NODE, PER_NODE]
    for n in nodes:
        node = layout_of(c, n["name"])
        assert n["cpus"] == node.cpus
        assert n["real_cores"] == {
            str(core): sorted(
                v for v, r in zip(node.cpus, node.real_cpus, strict=True) if r == core
            )
            for core in set(node.real_cpus)
        }
    text = c.run("pbsnodes", "-a").stdout
    cores = format_cpu_list(CORES)
    line = f"virtual = CPUs 0-{PER_NODE - 1} are virtual, carried by real cores"
    assert text.count(f"{line} {cores}: ") == 2
    assert f"np = {PER_NODE}" in text
    status = c.run("mb", "status").stdout
    assert status.count(f"virtual CPUs 0-{PER_NODE - 1} on real cores {cores}") == 2


def test_a_resize_rebinds_the_job_to_the_cores_of_its_new_cpus(
    cluster: ClusterFactory,
) -> None:
    c = virtual_cluster(cluster)
    jid = c.qsub("-l", "ncpus=4,malleable=1-4", "--", sys.executable, "-c", SPIN)
    record = c.wait_state(jid, "running")
    node = layout_of(c, record["node"])
    c.wait_for(lambda: len(thread_masks(c, jid)) >= 3, what="threads")
    start = cores_of(node, record["cpus"])
    assert all(m == start for m in thread_masks(c, jid))
    [proc] = c.job_procs(jid)
    env = proc.environ()
    assert parse_cpu_list(env["MB_CPU_LIST"]) == record["cpus"]
    # The file a malleable job reads lists the cores it may pin threads to.
    cpuset = Path(env["MB_CPUSET_FILE"])
    assert set(parse_cpu_list(cpuset.read_text().strip())) == start
    if os.geteuid() == 0:
        assert cgroup_cpus(proc.pid) == start

    c.run("qalter", "-l", "ncpus=1", jid)
    record = c.wait_resizes(jid, 1)
    (cpu,) = record["cpus"]
    one = cores_of(node, [cpu])
    assert all(m == one for m in thread_masks(c, jid))
    assert set(parse_cpu_list(cpuset.read_text().strip())) == one
    if os.geteuid() == 0:
        assert cgroup_cpus(proc.pid) == one

    c.run("qalter", "-l", "ncpus=4", jid)
    record = c.wait_resizes(jid, 2)
    assert len(record["cpus"]) == 4
    back = cores_of(node, record["cpus"])
    assert len(back) == min(4, len(CORES))
    assert all(m == back for m in thread_masks(c, jid))
    if os.geteuid() == 0:
        assert cgroup_cpus(proc.pid) == back
    c.run("qdel", jid)
    c.wait_state(jid, "finished", timeout=30)


# ------------------------------------------------- mb-node's own arguments


def test_the_node_takes_its_cores_from_real_cpus() -> None:
    here = set(CORES)
    core = CORES[0]
    args = _parse(
        ["--name", "n", "--cpus", "0-3", "--real-cpus", f"{core},{core},{core},{core}"]
    )
    node = virtual_layout(args, Config(), [0, 1, 2, 3], [], here)
    assert node is not None and node.real_cpus == [core] * 4
    assert (
        virtual_layout(
            _parse(["--name", "n", "--cpus", str(core)]), Config(), [core], [], here
        )
        is None
    )
    for real, message in (
        ("0,1", "names 2 cores for the 4 CPUs 0-3"),
        ("0,x,0,0", "malformed --real-cpus"),
        (
            f"{core},{core},{core},{max(here) + 1}",
            f"core {max(here) + 1}, which this process may not use",
        ),
    ):
        args = _parse(["--name", "n", "--cpus", "0-3", "--real-cpus", real])
        with pytest.raises(InvalidArgument, match=message):
            virtual_layout(args, Config(), [0, 1, 2, 3], [], here)


def test_a_node_started_from_the_config_gets_the_cores_mb_up_gives() -> None:
    config = Config(
        oversubscribe=True,
        nodes=[
            NodeConfig(name=f"n{i}", cpus=list(range(2 * len(CORES)))) for i in range(2)
        ],
    )
    laid_out = from_config(config, CORES)
    for i, expected in enumerate(laid_out):
        args = _parse(["--name", f"n{i}", "--from-config"])
        node = virtual_layout(args, config, expected.cpus, [], set(CORES))
        assert node == expected and node.real_cpus
