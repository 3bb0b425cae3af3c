"""Pure pieces of the node daemon: environment, identity, exit statuses, /proc."""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from minibatch.config import Config, NodeConfig
from minibatch.core.job import JobResult
from minibatch.errors import InvalidArgument
from minibatch.node import exits, procfs, reaper, records, thrash
from minibatch.node.cgroup import JobCgroup
from minibatch.node.identity import (
    Identity,
    LaunchError,
    describe_exec_error,
    resolve_identity,
)
from minibatch.node.jobenv import job_environment, nodefile_lines
from minibatch.node.ownership import Run, ended_report
from minibatch.node.service import _parse, cpu_map, main, node_settings
from minibatch.protocol.messages import LaunchSpec


def spec(**kw: object) -> LaunchSpec:
    fields: dict[str, object] = dict(
        job=12,
        display_id="12",
        name="sim",
        user="alice",
        uid=os.geteuid(),
        gid=os.getegid(),
        workdir="/w",
        script="true",
        argv=None,
        env={},
        stdout_path="o",
        stderr_path="e",
        join=False,
        cpus=[2, 3],
        hosts=["n1"],
        walltime=60,
        mem_kb=None,
    )
    fields.update(kw)
    return LaunchSpec(**fields)  # type: ignore[arg-type]


IDENT = Identity(1000, 1000, "alice", "/home/alice", "/bin/bash", [], False)


def env_of(s: LaunchSpec) -> dict[str, str]:
    return job_environment(
        s, node="n1", home="/mb", ident=IDENT, cpus=s.cpus, nodefile="/spool/12.nodes"
    )


def test_environment_for_a_plain_job() -> None:
    env = env_of(
        spec(
            env={
                "FOO": "1",
                "PBS_JOBID": "old",
                "SLURM_ARRAY_TASK_ID": "4",
                "PBS_O_HOST": "login",
                "PATH": "/opt/bin",
            }
        )
    )
    assert env["FOO"] == "1" and env["PBS_O_HOST"] == "login"
    assert env["PATH"] == "/opt/bin"  # the user's own wins over the default
    assert env["HOME"] == "/home/alice" and env["USER"] == env["LOGNAME"] == "alice"
    assert env["PBS_JOBID"] == env["MB_JOBID"] == "12"
    assert env["MB_CPU_LIST"] == "2,3"
    assert env["MB_CPUS"] == env["OMP_NUM_THREADS"] == env["SLURM_CPUS_ON_NODE"] == "2"
    assert env["MB_NODE"] == "n1" and env["MB_HOME"] == "/mb"
    assert env["PBS_NODEFILE"] == "/spool/12.nodes"
    assert env["SLURM_JOB_ID"] == "12" and env["PBS_ENVIRONMENT"] == "PBS_BATCH"
    # An inherited array variable must not make this job look like a task.
    assert "SLURM_ARRAY_TASK_ID" not in env and "PBS_ARRAYID" not in env


def test_environment_for_an_array_task() -> None:
    env = env_of(spec(display_id="9[4]", array_id=9, array_index=4))
    assert env["PBS_JOBID"] == "9[4]" and env["PBS_ARRAYID"] == "4"
    assert env["SLURM_ARRAY_JOB_ID"] == "9" and env["SLURM_ARRAY_TASK_ID"] == "4"
    assert env["PATH"]  # a default when the submitter had none


def test_nodefile_lists_each_host_once_per_cpu() -> None:
    assert nodefile_lines(spec(hosts=["a", "b"]), "x") == ["a", "a", "b", "b"]
    assert nodefile_lines(spec(hosts=[]), "x") == ["x", "x"]


def test_identity_rules() -> None:
    me = resolve_identity(spec(), os.geteuid())
    assert not me.switch
    with pytest.raises(LaunchError, match="without root privileges"):
        resolve_identity(spec(uid=4321), 1000)
    other = resolve_identity(spec(uid=4321, gid=77), 0)
    assert other.switch and other.groups == [77]  # unknown uid: run it anyway


def test_cpu_map_wraps_cpus_the_machine_lacks() -> None:
    assert cpu_map([0, 1], {0, 1, 2, 3}) == {0: 0, 1: 1}
    assert cpu_map([2, 3, 4, 5], {0, 1}) == {2: 0, 3: 1, 4: 0, 5: 1}


def _run(status: int | None, reason: JobResult | None = None) -> Run:
    run = Run(spec(), None, 1, 0.0, status=status)  # type: ignore[arg-type]
    run.kill_reason = reason
    return run


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (0, None, (JobResult.COMPLETED, 0, None)),
        (3 << 8, None, (JobResult.FAILED, 3, None)),
        (signal.SIGSEGV, None, (JobResult.FAILED, 256 + 11, 11)),
        (signal.SIGTERM, JobResult.TIMEOUT, (JobResult.TIMEOUT, 271, 15)),
        (0, JobResult.CANCELLED, (JobResult.CANCELLED, 0, None)),
        (None, JobResult.NODE_FAIL, (JobResult.NODE_FAIL, None, None)),
    ],
)
def test_exit_status_follows_pbs(
    status: int | None, reason: JobResult | None, expected: tuple[object, ...]
) -> None:
    r = ended_report(_run(status, reason))
    assert (r.result, r.exit_status, r.signal) == expected


def test_signal_death_is_explained() -> None:
    assert "SIGSEGV" in ended_report(_run(signal.SIGSEGV)).comment


def test_procfs_reads_this_process() -> None:
    me = procfs.read_stat(os.getpid())
    assert me is not None
    assert (me.ppid, me.pgid, me.sid) == (os.getppid(), os.getpgid(0), os.getsid(0))
    assert me.rss_kb > 0 and not me.zombie
    assert procfs.read_stat(2**22 + 1) is None
    env = procfs.read_environ(os.getpid())
    assert env is not None and "PATH" in env
    table = procfs.ProcTable.scan()
    assert os.getpid() in table.subtree([os.getppid()])
    assert os.getpid() in table.members(os.getsid(0))


def test_main_without_cpus_fails_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MB_HOME", str(tmp_path))
    assert main(["--name", "nowhere"]) == 1


def test_node_settings_from_config() -> None:
    config = Config(
        nodes=[
            NodeConfig(name="a", cpus=[0, 1], mem="1gb"),
            NodeConfig(name="b", cpus=[1, 2]),
        ]
    )
    args = _parse(["--name", "a", "--from-config"])
    assert node_settings(args, config) == ([0, 1], 1 << 20, [1])
    args = _parse(["--name", "b", "--cpus", "5", "--mem", "2mb", "--shared-cpus", ""])
    assert node_settings(args, config) == ([5], 2048, [])
    with pytest.raises(InvalidArgument):
        node_settings(_parse(["--name", "c"]), config)


def test_a_record_is_written_once_and_its_pid_appended(tmp_path: Path) -> None:
    rec = records.RunRecord(node="n1", spec=spec(), pid=0, start=1.5, limit=60.0)
    records.begin(tmp_path, rec)
    (before,) = records.load_all(tmp_path)
    assert before.pid == 0 and before.spec.job == 12
    records.started(tmp_path, 12, 4321)
    (after,) = records.load_all(tmp_path, "n1")
    assert after.pid == 4321 and after.start == 1.5 and after.limit == 60.0
    assert not records.load_all(tmp_path, "n2")
    # A later version replaces the whole record, pid included.
    records.save(tmp_path, records.RunRecord(node="n1", spec=spec(), pid=99, start=2))
    assert [r.pid for r in records.load_all(tmp_path)] == [99]


def test_a_new_run_of_a_job_drops_the_end_of_its_last_run(tmp_path: Path) -> None:
    """A reaper's file of an earlier run (qrerun) is never this run's."""
    records.begin(tmp_path, records.RunRecord(node="n1", spec=spec(), pid=0, start=1))
    records.started(tmp_path, 12, 4321)
    end = reaper.ExitRecord(pid=4321, status=0, end=2.0)
    assert reaper.write(tmp_path, 12, end)
    assert reaper.read(tmp_path, 12, 4321) == end
    records.begin(tmp_path, records.RunRecord(node="n1", spec=spec(), pid=0, start=3))
    assert not reaper.path(tmp_path, 12).exists()
    assert not reaper.write(tmp_path, 13, end)  # no record: reported already


def test_a_record_cut_short_is_discarded(tmp_path: Path) -> None:
    rec = records.RunRecord(node="n1", spec=spec(), pid=0, start=1.5)
    records.begin(tmp_path, rec)
    whole = records.path(tmp_path, 12).read_bytes()
    records.path(tmp_path, 12).write_bytes(whole[: len(whole) // 2])
    assert records.load_all(tmp_path) == []
    assert not records.path(tmp_path, 12).exists()
    records.path(tmp_path, 12).write_bytes(whole + b"\n12x")
    assert records.load_all(tmp_path) == []


def test_process_events_give_the_wait_status_of_a_process_not_ours() -> None:
    # The kernel's own events (this suite runs as root, as a production node
    # daemon does): an orphan of a shell, which the shell never waits for.
    watch = exits.ExitWatch.open()
    assert watch is not None
    try:
        out = subprocess.run(
            ["/bin/sh", "-c", "(sleep 0.2; exit 5) & echo $!"],
            capture_output=True,
            text=True,
            check=True,
        )
        orphan = int(out.stdout)
        watch.watch(orphan)
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            select.select([watch], [], [], 0.5)
            watch.drain(lambda pid, status: seen.append((pid, status)))
        assert seen == [(orphan, 5 << 8)]
    finally:
        watch.close()


def test_an_exit_watch_may_be_closed_by_what_it_reports() -> None:
    # The last re-adopted job's end closes the watch from inside drain().
    watch = exits.ExitWatch.open()
    assert watch is not None
    pids = []
    for _ in range(2):
        out = subprocess.run(
            ["/bin/sh", "-c", "(exit 1) & echo $!"], capture_output=True, text=True
        )
        pids.append(int(out.stdout))
    for pid in pids:
        watch.watch(pid)
    seen: list[int] = []

    def ended(pid: int, status: int) -> None:
        seen.append(pid)
        if len(seen) == 1:
            watch.close()

    for pid in pids:  # both gone (orphans of the shell, reaped by init)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.01)
    select.select([watch], [], [], 5)
    watch.drain(ended)  # must not read on after the callback closed it
    assert seen == pids


def test_process_event_datagrams_are_parsed_by_their_layout() -> None:
    def event(what: int, pid: int, tgid: int, status: int) -> bytes:
        body = struct.pack("=IIIIHH", 1, 1, 0, 0, 40, 0)
        body += struct.pack("=IIQ", what, 0, 0)
        body += struct.pack("=IIII", pid, tgid, status, 17)
        return struct.pack("=IHHII", 16 + len(body), 3, 0, 0, 0) + body

    exit_ = 0x80000000
    data = event(exit_, 10, 10, 256) + event(exit_, 11, 10, 0) + event(1, 12, 12, 0)
    assert exits.parse(data) == [(10, 256)]  # a thread's exit and a fork are not
    assert exits.parse(b"\0" * 10) == []


def test_a_missing_interpreter_is_read_without_waiting(tmp_path: Path) -> None:
    me = Identity(os.geteuid(), os.getegid(), "me", "/", "/bin/sh", [], False)
    script = tmp_path / "job.sh"
    script.write_text("#!/opt/none/ksh -l\necho\n")
    gone = FileNotFoundError(2, "No such file or directory", "job.sh")
    why = describe_exec_error(gone, ["job.sh"], str(tmp_path), me)  # workdir-relative
    assert why == "/opt/none/ksh: bad interpreter: No such file or directory"
    # Swapped for a FIFO after the exec failed: no read, no wait.
    script.unlink()
    os.mkfifo(script)
    assert describe_exec_error(gone, ["job.sh"], str(tmp_path), me).startswith(
        "No such file or directory"
    )


def test_a_memory_cgroup_is_read_as_the_kernel_writes_it(tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "memory.limit_in_bytes").write_text(f"{64 << 20}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{63 << 20}\n")
    # v1 counts shared memory as cache; kernels before 5.9 had no _file.
    (v1 / "memory.stat").write_text(
        "cache 3145728\nrss 62914560\nshmem 1048576\nworkingset_refault 77\n"
    )
    sample = JobCgroup({"memory": str(v1)}, v2=False).memory_now()
    assert sample is not None
    assert (sample.used, sample.limit, sample.files, sample.refaults) == (
        63 << 20,
        64 << 20,
        2 << 20,
        77,
    )
    assert (sample.stall_us is None) == (not Path("/proc/pressure/memory").exists())
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("4096\n")
    (v2 / "memory.stat").write_text(
        "anon 0\nfile 8192\nshmem 4096\nworkingset_refault_file 9\n"
    )
    (v2 / "memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=99\n"
    )
    sample = JobCgroup({"": str(v2)}, v2=True).memory_now()
    assert sample == thrash.Sample(4096, 0, 4096, 9, 1234)


def _looks(
    watch: thrash.Watch, looks: list[tuple[float, int, int, int]]
) -> list[float]:
    """What ``watch`` says at each (time, files MiB, refaults, stall s), for a
    job at its 64 MiB limit."""
    full = 64 << 20
    return [
        watch.look(thrash.Sample(full, full, files << 20, ref, int(stall * 1e6)), t)
        for t, files, ref, stall in looks
    ]


def test_thrashing_is_a_spell_of_looks_at_a_full_limit_stalling_on_memory() -> None:
    # At the limit with 1 MiB of files, reading back more at each look and
    # stalling half the time: thrashing from the first look that saw it.
    looks = [(0.0, 1, 10, 0.0)] + [
        (t, 1, 10 + int(t * 100), t / 2) for t in (1, 2, 3, 4)
    ]
    assert _looks(thrash.Watch(), looks) == [0.0, 0.0, 0.0, 0.0, 3.0]
    # A look with nothing read back ends the spell; the next one starts anew.
    stop = [(5.0, 1, 410, 2.5), (6.0, 1, 500, 3.0), (7.0, 1, 600, 3.5)]
    watch = thrash.Watch()
    assert _looks(watch, looks + stop)[-3:] == [0.0, 0.0, 0.0]
    # Two late looks are not a spell, however long apart.
    assert _looks(
        thrash.Watch(), [(0.0, 1, 1, 0), (5.0, 1, 9, 5), (9.0, 1, 20, 9)]
    ) == [
        0.0,
        0.0,
        0.0,
    ]


def test_room_or_little_stall_is_not_thrashing() -> None:
    def spell(files_mib: int, stall_share: float, used: int = 64 << 20) -> float:
        watch = thrash.Watch()
        said = 0.0
        for n in range(6):
            sample = thrash.Sample(
                used, 64 << 20, files_mib << 20, 100 * n, int(n * stall_share * 1e6)
            )
            said = watch.look(sample, float(n))
        return said

    assert spell(1, 0.5) == 4.0  # the case above: thrashing
    assert spell(40, 0.5) == 0.0  # a cache that is most of its memory: room
    assert spell(1, 0.14) == 0.0  # re-reading through a small cache at its pace
    assert spell(1, 0.5, used=40 << 20) == 0.0  # well below the limit
    # No limit, or no pressure kept by the kernel: never.
    watch = thrash.Watch()
    for n in range(6):
        assert watch.look(thrash.Sample(1, 0, 0, n, n * 10**6), float(n)) == 0.0
        assert watch.look(None, float(n)) == 0.0
