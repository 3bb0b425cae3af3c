"""Real-world job scripts, submitted held: does qsub read them as their sites meant?

The corpus in ``tests/corpus/scripts`` holds job scripts in the styles of real HPC
sites and eras (Torque/Moab ``nodes=N:ppn=M`` with node properties and ``-t``
arrays, PBS Pro ``select=`` chunks and ``-J`` arrays, a Cray ``mppwidth`` script,
and Slurm ``#SBATCH`` scripts in the spellings users write). They were written for
this test in the forms of public scripts, none copied; ``tests/corpus/README.md``
says which style each imitates.

``tests/corpus/cases.toml`` says, for each script, what the job must ask for once
submitted (its keys are described at the top of that file). Each case is submitted
with ``qsub -h [ARGS] SCRIPT`` from a fresh directory, so it never runs; its
``qstat -f --json`` record is compared field by field with the case, then it is
deleted. A case may instead expect qsub to refuse the script: a request no node of
the test cluster could ever satisfy, or a group the submitter is not in.

One cluster serves the whole module: 4 nodes of 16 CPUs (oversubscribed on however
few cores the machine has), with node features, GPUs on node0 and the queues
batch, short, long and debug.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, Cluster, make_home, toml_text

from minibatch.cluster.layout import NodeLayout, usable_cpus

CORPUS = REPO / "tests" / "corpus"
SCRIPTS = CORPUS / "scripts"
CASES: list[dict[str, Any]] = tomllib.loads((CORPUS / "cases.toml").read_text())["case"]

NODES = 4
CPUS_PER_NODE = 16
#: The test cluster's minibatch.toml, as ``toml_text`` overrides.
CLUSTER_CONFIG: dict[str, Any] = {
    "strict": False,
    "default_queue": "batch",
    "oversubscribe": True,
    "queue": [
        {"name": "batch"},
        {"name": "short", "max_walltime": "01:00:00"},
        {"name": "long"},
        {"name": "debug", "max_walltime": "00:30:00"},
    ],
    # Some scripts name a QOS (--qos=normal), as most Slurm sites require.
    "qos": [{"name": "normal"}],
    "features": {"node0": ["gpu", "xe"], "node1": ["xe"], "node2": ["bigmem"]},
    "gpus": {"node0": 2},
}

#: Where each expectation is found in a ``qstat -f --json`` record: first as laid
#: out in :class:`minibatch.core.job.Job`, then under ``qstat --json``'s flat names.
FIELDS: dict[str, str] = {
    "job_id": "job_id",
    "state": "state",
    "name": "name",
    "nodes": "nodes",
    "ppn": "ppn",
    "mem_kb": "mem_kb",
    "walltime": "walltime",
    "gpus": "gpus",
    "queue": "queue",
    "account": "account",
    "features": "options.features",
    "array_id": "array_id",
    "array_index": "array_index",
    "array_limit": "options.array_limit",
    "stdout": "output_path",
    "stderr": "error_path",
}
#: Expectations compared as they are (``mem_kb = "none"`` standing for null).
SCALARS = (
    "name",
    "nodes",
    "ppn",
    "mem_kb",
    "walltime",
    "gpus",
    "queue",
    "account",
    "array_limit",
)
PATHS = ("stdout", "stderr")
#: Every key a case may have.
CASE_KEYS = frozenset(
    {"script", "args", "dirs", "features", "array", "notes", "refused"}
    | set(SCALARS)
    | set(PATHS)
)


# ------------------------------------------------------------------ the cluster


def virtual_layout(nodes: int, cpus_per_node: int) -> list[NodeLayout]:
    """``nodes`` nodes of ``cpus_per_node`` distinct CPU ids each.

    The ids need not exist: the node daemons wrap them onto the real cores, so a
    laptop can host 16-CPU nodes. Jobs here are only ever held, never run.
    """
    real = len(usable_cpus())
    shared = nodes * cpus_per_node > real
    layout = []
    for i in range(nodes):
        cpus = list(range(i * cpus_per_node, (i + 1) * cpus_per_node))
        layout.append(
            NodeLayout(name=f"node{i}", cpus=cpus, shared_cpus=cpus if shared else [])
        )
    return layout


@pytest.fixture(scope="module")
def corpus_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One running cluster for every case, built as the ``cluster`` fixture does."""
    home, temporary = make_home(tmp_path_factory.mktemp("corpus"))
    c = Cluster(home, virtual_layout(NODES, CPUS_PER_NODE), temporary)
    c.paths.config.write_text(toml_text("easy", CLUSTER_CONFIG))
    try:
        c.up()
        yield c
    finally:
        c.teardown()


# -------------------------------------------------------------------- the cases


def case_id(case: dict[str, Any]) -> str:
    return Path(case["script"]).stem


def submitter() -> str:
    """The login name jobs submitted from here belong to."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def case_dir(cluster: Cluster, case: dict[str, Any]) -> Path:
    """A fresh submit directory for ``case``, with the directories it names."""
    workdir = cluster.work / case_id(case)
    workdir.mkdir(parents=True)
    for name in case.get("dirs", []):
        (workdir / name.format(user=submitter())).mkdir(parents=True, exist_ok=True)
    # qsub records os.getcwd(), which has every symlink resolved.
    return workdir.resolve()


def submit(
    cluster: Cluster, case: dict[str, Any], workdir: Path
) -> subprocess.CompletedProcess[str]:
    """``qsub -h [ARGS] SCRIPT`` from ``workdir`` (options come before the script)."""
    script = SCRIPTS / case["script"]
    return cluster.run(
        "qsub", "-h", *case.get("args", []), str(script), check=False, cwd=workdir
    )


def qdel(cluster: Cluster, printed_id: str) -> None:
    cluster.run("qdel", printed_id, check=False)


def field(record: dict[str, Any], key: str) -> Any:
    """The value of ``key`` in a ``qstat --json`` job record."""
    value: Any = record
    for part in FIELDS[key].split("."):
        value = value[part]
    return value


def expected(case: dict[str, Any], key: str) -> Any:
    value = case[key]
    return None if key == "mem_kb" and value == "none" else value


def expected_path(workdir: Path, pattern: str, **names: object) -> str:
    return os.path.normpath(workdir / pattern.format(**names))


def fetch_records(
    cluster: Cluster, printed_id: str, case: dict[str, Any]
) -> list[dict[str, Any]]:
    """The job's ``qstat -f --json`` records: one, or one per array task."""
    if "array" in case:
        assert printed_id.endswith("[]"), (
            f"an array should print ID[], qsub printed {printed_id!r}"
        )
        return cluster.qstat_json("-f", printed_id)
    assert not printed_id.endswith("[]"), f"not an array, qsub printed {printed_id!r}"
    records = cluster.qstat_json("-f", printed_id)
    assert len(records) == 1, f"{printed_id} names {len(records)} jobs"
    return records


def task_problems(
    record: dict[str, Any], case: dict[str, Any], workdir: Path, printed_id: str
) -> list[str]:
    """How one job (or array task) differs from what ``case`` expects."""
    problems = []
    if field(record, "state") != "held":
        problems.append(f"state: expected held, got {field(record, 'state')!r}")
    for key in SCALARS:
        if key in case and (got := field(record, key)) != (want := expected(case, key)):
            problems.append(f"{key}: expected {want!r}, got {got!r}")
    if "features" in case:
        got = sorted(field(record, "features") or [])
        if got != sorted(case["features"]):
            problems.append(f"features: expected {sorted(case['features'])}, got {got}")
    if "array" not in case and field(record, "array_id") is not None:
        problems.append(f"array_id: expected none, got {field(record, 'array_id')!r}")
    names = {
        "id": field(record, "job_id"),
        "array": printed_id.removesuffix("[]"),
        "index": field(record, "array_index"),
        "user": submitter(),
    }
    for key in PATHS:
        if key in case:
            want = expected_path(workdir, case[key], **names)
            got = field(record, key)
            if not got or os.path.normpath(got) != want:
                problems.append(f"{key}: expected {want}, got {got!r}")
    return problems


def job_problems(
    records: list[dict[str, Any]],
    case: dict[str, Any],
    workdir: Path,
    printed_id: str,
) -> list[str]:
    """How the submitted job (every task of an array) differs from ``case``."""
    problems = []
    if "array" in case:
        indices = sorted(field(r, "array_index") for r in records)
        if indices != case["array"]:
            problems.append(f"array: expected indices {case['array']}, got {indices}")
    for record in records:
        found = task_problems(record, case, workdir, printed_id)
        if "array" in case:
            found = [f"task {field(record, 'array_index')}: {p}" for p in found]
        problems += found
    return problems


def check_refused(proc: subprocess.CompletedProcess[str], case: dict[str, Any]) -> None:
    wanted = case["refused"]
    wanted = [wanted] if isinstance(wanted, str) else wanted
    assert proc.returncode != 0, (
        f"qsub accepted {case['script']} (printed {proc.stdout.strip()!r}); "
        f"expected it refused with {wanted}"
    )
    assert not proc.stdout.strip(), f"a refused qsub printed {proc.stdout!r}"
    missing = [w for w in wanted if w.lower() not in proc.stderr.lower()]
    assert not missing, f"qsub's error lacks {missing}: {proc.stderr!r}"


# -------------------------------------------------------------------- the tests


def test_every_script_has_one_case() -> None:
    """The corpus and cases.toml agree, and each case is well formed."""
    named = [case["script"] for case in CASES]
    on_disk = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file())
    assert sorted(named) == on_disk, "cases.toml and scripts/ list different scripts"
    assert len(set(named)) == len(named), "a script has two cases"
    assert len(CASES) >= 36
    texts = [(SCRIPTS / name).read_text() for name in named]
    assert len(set(texts)) == len(texts), "two scripts are identical"
    for case in CASES:
        unknown = set(case) - CASE_KEYS
        assert not unknown, f"{case['script']}: unknown keys {sorted(unknown)}"
        if "refused" in case:
            others = set(case) - {"script", "args", "dirs", "refused"}
            assert not others, f"{case['script']}: refused, yet expects {others}"


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_corpus_script(corpus_cluster: Cluster, case: dict[str, Any]) -> None:
    workdir = case_dir(corpus_cluster, case)
    proc = submit(corpus_cluster, case, workdir)
    printed_id = proc.stdout.strip()
    if "refused" in case:
        try:
            check_refused(proc, case)
        finally:
            if proc.returncode == 0 and printed_id:
                qdel(corpus_cluster, printed_id)
        return
    assert proc.returncode == 0, (
        f"qsub refused {case['script']} (exit {proc.returncode}): {proc.stderr}"
    )
    try:
        assert printed_id and "\n" not in printed_id, f"qsub printed {proc.stdout!r}"
        missing = [n for n in case.get("notes", []) if n not in proc.stderr]
        assert not missing, f"qsub's notes lack {missing}: {proc.stderr!r}"
        records = fetch_records(corpus_cluster, printed_id, case)
        problems = job_problems(records, case, workdir, printed_id)
        assert not problems, f"{case['script']} (qsub stderr: {proc.stderr!r}):\n" + (
            "\n".join(problems)
        )
    finally:
        qdel(corpus_cluster, printed_id)
