"""Cluster job scripts run unchanged, and what they ask for is what they get.

Each test submits a script in the form people bring from a Torque, PBS Pro or
Slurm site to a live cluster and checks what the operating system saw: the
interpreter and arguments, the environment, file modes, output file names, the
signal before the time limit, CPU-time limits, array slot limits, start times,
queue order and GPUs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.integration.conftest import BIN, Cluster, ClusterFactory, wait_for

QUEUES = {
    "queue": [
        {"name": "batch"},
        {"name": "short", "max_walltime": "00:10:00", "default_walltime": 300},
        {"name": "express", "priority": 100.0},
        {"name": "closed", "enabled": False},
    ],
    "features": {"node0": ["fast"]},
    "gpus": {"node0": 2},
}


def env_file(path: Path) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in path.read_text().splitlines() if "=" in line
    )


@pytest.mark.timeout(90)
def test_a_torque_script_runs_as_written(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, **QUEUES)
    (c.work / "logs").mkdir()
    script = c.work / "analysis.pbs"
    script.write_text(
        "#!/bin/sh\n"
        "#PBS -N analysis\n"
        "#PBS -S /bin/bash\n"
        "#PBS -q short          # the site's short queue\n"
        "#PBS -l nodes=1:ppn=1,walltime=00:02:00\n"
        "#PBS -W umask=027\n"
        '#PBS -F "first second"\n'
        "#PBS -m abe -M someone@example.org\n"
        "#PBS -l mppwidth=24    # Cray-only: recorded\n"
        "#PBS -o logs/\n"
        "#PBS -j oe\n"
        'cd "$PBS_O_WORKDIR"\n'
        'echo "args=$1,$2 bash=${BASH_VERSION:+yes}"\n'
        "env > env.txt\n"
        "touch made-by-job\n"
        'test -d "$TMPDIR" && touch "$TMPDIR/scratch" && echo "$TMPDIR" > tmpdir.txt\n'
    )
    proc = c.run("qsub", str(script))
    job = proc.stdout.strip()
    assert "mppwidth=24: no effect" in proc.stderr
    record = c.wait_state(job, "completed", timeout=30)
    out = (c.work / "logs" / f"analysis.o{job}").read_text()
    assert out == "args=first,second bash=yes\n"
    env = env_file(c.work / "env.txt")
    assert env["PBS_QUEUE"] == "short" and env["PBS_O_QUEUE"] == "short"
    assert (env["PBS_TASKNUM"], env["PBS_VNODENUM"], env["PBS_JOBNAME"]) == (
        "1",
        "0",
        "analysis",
    )
    assert env["PBS_JOBID"] == job and env["NCPUS"] == "1"
    mode = stat.S_IMODE(os.stat(c.work / "made-by-job").st_mode)
    assert mode == 0o640  # 0666 & ~027
    tmpdir = Path((c.work / "tmpdir.txt").read_text().strip())
    assert not tmpdir.exists()  # removed with the job
    assert record["queue"] == "short"
    full = c.run("qstat", "-f", "-x", job).stdout
    for line in ("queue = short", "Mail_Points = abe", "recorded.mppwidth = 24"):
        assert line in full, full


@pytest.mark.timeout(90)
def test_a_slurm_script_runs_with_sbatch_and_qsub(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=2, **QUEUES)
    script = c.work / "omp.slurm"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name omp\n"
        "#SBATCH --cpus-per-t=2 --ntasks 1   # abbreviated, as getopt allows\n"
        "#SBATCH --time 01:00\n"
        "#SBATCH --partition=gpu,short\n"
        "#SBATCH -o %x-%j.out\n"
        "#SBATCH --mem-per-cpu=10M\n"
        'echo "$SLURM_CPUS_PER_TASK $SLURM_NTASKS $SLURM_JOB_PARTITION '
        '$SLURM_MEM_PER_NODE $SLURM_JOB_NAME $MB_CPUS"\n'
        "echo to-stderr >&2\n"
    )
    proc = c.run("sbatch", str(script))
    assert proc.stdout.startswith("Submitted batch job ")
    job = proc.stdout.split()[-1]
    c.wait_state(job, "completed", timeout=30)
    out = (c.work / f"omp-{job}.out").read_text()
    assert out == "2 1 short 20 omp 2\nto-stderr\n"
    # The same script through qsub: #SBATCH lines are read there too.
    job2 = c.qsub(str(script))
    c.wait_state(job2, "completed", timeout=30)
    assert (c.work / f"omp-{job2}.out").read_text().startswith("2 1 short")
    # A partition nobody has: the default queue, with a note.
    proc = c.run("sbatch", "-p", "nowhere", "--parsable", "--wrap", "true")
    assert "queue nowhere does not exist here" in proc.stderr
    assert c.job(proc.stdout.strip())["queue"] == "batch"


@pytest.mark.timeout(90)
def test_signal_before_the_time_limit(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    script = c.work / "checkpoint.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --time=1 --signal=B:USR1@57\n"
        "trap 'echo checkpointed > ckpt.txt; exit 0' USR1\n"
        "sleep 120 & wait\n"
    )
    job = c.run("sbatch", "--parsable", str(script)).stdout.strip()
    record = c.wait_state(job, "completed", timeout=40)
    assert (c.work / "ckpt.txt").read_text() == "checkpointed\n"
    # Three seconds into a one-minute limit, long before the limit itself.
    assert record["end_time"] - record["start_time"] < 30


@pytest.mark.timeout(90)
def test_cput_limit_ends_a_busy_job(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    job = c.qsub("-l", "cput=2,walltime=60", "--", "sh", "-c", "while :; do :; done")
    record = c.wait_state(job, "timeout", timeout=40)
    assert "cput limit of 2 s exceeded" in record["comment"]
    # The OS's count of the job's CPU time passed the limit before the kill.
    assert record["cputime_s"] >= 2.0


@pytest.mark.timeout(90)
def test_array_slot_limit_and_names(cluster: ClusterFactory) -> None:
    c = cluster(nodes=2)
    script = c.work / "array.pbs"
    script.write_text(
        "#!/bin/sh\n#PBS -J 1-3%1\n#PBS -o out.^array_index^\n#PBS -j oe\n"
        'echo "$PBS_ARRAY_INDEX $PBS_ARRAYID"\nsleep 1\n'
    )
    array = c.qsub(str(script))
    base = array.removesuffix("[]")
    most = 0

    def done() -> bool:
        nonlocal most
        tasks = c.qstat_json("-x", f"{base}[]")
        most = max(most, sum(t["state"] == "running" for t in tasks))
        return all(t["state"] == "finished" for t in tasks)

    wait_for(done, 40, what="array done")
    assert most == 1  # two nodes were free, the limit says one at a time
    for i in (1, 2, 3):
        assert (c.work / f"out.{i}").read_text() == f"{i} {i}\n"


@pytest.mark.timeout(90)
def test_begin_time_priority_and_block(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, **QUEUES)
    later = c.run("sbatch", "--parsable", "--begin=now+3", "--wrap", "true").stdout
    later = later.strip()
    record = c.job(later)
    assert record["letter"] == "W" and "not before" in record["reason"]
    done = c.wait_state(later, "completed", timeout=30)
    assert done["start_time"] >= done["submit_time"] + 3
    # Queue priority, then -p, then submission order, behind a busy node.
    busy = c.qsub("--", "sleep", "30")
    c.wait_state(busy, "running")
    low = c.qsub("-p", "-5", "--", "true")
    high = c.qsub("-p", "10", "--", "true")
    express = c.qsub("-q", "express", "--", "true")
    c.run("qdel", busy)
    ends = {j: c.wait_state(j, "completed")["start_time"] for j in (low, high, express)}
    assert ends[express] <= ends[high] <= ends[low]
    # -W block=true: qsub waits, and exits with the job's status.
    proc = c.run("qsub", "-W", "block=true", "--", "sh", "-c", "exit 3", check=False)
    assert proc.returncode == 3
    job = proc.stdout.strip()
    assert c.job(job)["exit_status"] == 3


@pytest.mark.timeout(90)
def test_queues_gpus_and_features(cluster: ClusterFactory) -> None:
    c = cluster(nodes=2, **QUEUES)
    job = c.qsub(
        "-l",
        "nodes=1:ppn=1:gpus=2:fast",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    )
    record = c.wait_state(job, "completed", timeout=30)
    assert record["node"] == "node0" and record["gpu_ids"] == [0, 1]
    out = Path(record["output_path"]).read_text()
    assert out == "0,1\n"
    # Only node0 has the feature: a second such job waits for it, while node1
    # stays free and runs a job without features.
    first = c.qsub("-l", "nodes=1:fast", "--", "sleep", "30")
    assert c.wait_state(first, "running")["node"] == "node0"
    second = c.qsub("-l", "nodes=1:fast", "--", "true")
    plain = c.qsub("--", "true")
    assert c.wait_state(plain, "completed")["node"] == "node1"
    assert c.job(second)["state"] == "queued"
    c.run("qdel", first)
    assert c.wait_state(second, "completed")["node"] == "node0"
    proc = c.run("qsub", "-l", "nodes=1:slow", "--", "true")
    assert "node feature slow: no node has it" in proc.stderr
    script = c.work / "closed.pbs"
    script.write_text("#!/bin/sh\n#PBS -N x\n#PBS -q closed\ntrue\n")
    proc = c.run("qsub", str(script), check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "closed.pbs line 3 (#PBS -q closed): queue 'closed' is closed" in proc.stderr
    for args, says in [
        (("-q", "closed"), "closed to new jobs"),
        (("-q", "short", "-l", "walltime=1:00:00"), "exceeds queue 'short'"),
        (("-l", "gpus=3"), "can never run"),
    ]:
        proc = c.run("qsub", *args, "--", "true", check=False)
        assert proc.returncode == 1 and says in proc.stderr, proc.stderr
    # The queue's default walltime for a job that asks for none.
    assert c.job(c.qsub("-h", "-q", "short", "--", "true"))["walltime"] == 300


@pytest.mark.timeout(60)
def test_qsub_strict_refuses_unknown_queue(cluster: ClusterFactory) -> None:
    c: Cluster = cluster(nodes=1, strict=True, **QUEUES)
    proc = c.run("qsub", "-q", "nowhere", "--", "true", check=False)
    assert proc.returncode == 1 and "unknown queue 'nowhere'" in proc.stderr
    proc = c.run("qsub", "-l", "nodes=1:slow", "--", "true", check=False)
    assert proc.returncode == 1 and "no node has feature slow" in proc.stderr
    assert c.jobs() == []


@pytest.mark.timeout(60)
def test_job_mail_goes_through_sendmail(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    box = tmp_path / "mailbox"
    box.mkdir()
    fake = tmp_path / "sendmail"
    # One file per mail, complete when it appears: two sendmails may run at once.
    fake.write_text(
        f'#!/bin/sh\n{{ echo "ARGS $*"; cat; }} > {box}/.part.$$ && '
        f"mv {box}/.part.$$ {box}/mail.$$\n"
    )
    fake.chmod(0o755)

    def mails(count: int) -> list[str]:
        wait_for(lambda: len(list(box.glob("mail.*"))) == count, 10, what="mails")
        return [p.read_text() for p in box.glob("mail.*")]

    c = cluster(nodes=1, server={"sendmail": str(fake)})
    job = c.qsub("-m", "be", "-M", "alice@example.org", "--", "true")
    c.wait_state(job, "completed")
    got = mails(2)
    assert all("ARGS -t -oi" in m and "To: alice@example.org" in m for m in got)
    assert sorted("Begun execution" in m for m in got) == [False, True]
    assert sorted("Execution terminated" in m for m in got) == [False, True]
    # PBS's default: mail to the owner when the system ends the job (abort).
    victim = c.qsub("--", "sleep", "30")
    c.wait_state(victim, "running")
    c.run("qdel", victim)
    c.wait_state(victim, "cancelled")
    aborted = [m for m in mails(3) if f"PBS JOB {victim}" in m]
    assert len(aborted) == 1 and "Aborted" in aborted[0]


@pytest.mark.timeout(60)
def test_vmem_is_the_kernels_address_space_limit(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    # The limit is set on the top process as it starts; what it runs after
    # inherits it (the sleep keeps the check clear of that first instant).
    job = c.qsub(
        "-l",
        "vmem=200mb",
        "--",
        "sh",
        "-c",
        "sleep 0.5; grep 'Max address space' /proc/self/limits",
    )
    record = c.wait_state(job, "completed", timeout=30)
    fields = Path(record["output_path"]).read_text().split()
    assert fields[3:5] == [str(200 * 1024 * 1024)] * 2


@pytest.mark.timeout(90)
def test_what_a_new_user_tried(cluster: ClusterFactory) -> None:
    """Found by trying scripts as a new user: each line once went wrong."""
    c = cluster(
        nodes=2,
        queue=[
            {"name": "batch"},
            {"name": "short", "max_walltime": 600},
            {"name": "shut", "enabled": False},
        ],
    )
    # --test-only asks the server, and queues nothing.
    proc = c.run("sbatch", "--test-only", "-p", "shut", "--wrap", "true", check=False)
    assert proc.returncode == 1 and "closed to new jobs" in proc.stderr
    proc = c.run("sbatch", "--test-only", "--wrap", "true")
    assert "valid and was not submitted" in proc.stdout
    assert c.jobs() == []
    # A queue with a limit and no default: a job asking no walltime gets the limit.
    job = c.run("sbatch", "--parsable", "-p", "short", "--wrap", "true").stdout.strip()
    assert c.job(job)["walltime"] == 600
    # -n 2 without -N on two one-CPU nodes: one task on each.
    spread = c.run(
        "sbatch", "--parsable", "-n", "2", "--wrap", "echo $SLURM_NTASKS $SLURM_NNODES"
    )
    record = c.wait_state(spread.stdout.strip(), "completed", timeout=30)
    assert Path(record["output_path"]).read_text() == "2 2\n"
    assert "spread over 2 nodes" in spread.stderr
    # A #PBS -o name with ^array_index^ read by sbatch is still PBS's.
    script = c.work / "arr.pbs"
    script.write_text(
        "#!/bin/sh\n#PBS -J 1-2\n#PBS -o out.^array_index^\necho $PBS_ARRAY_INDEX\n"
    )
    array = c.run("sbatch", "--parsable", str(script)).stdout.strip()
    wait_for(
        lambda: all(t["state"] == "finished" for t in c.qstat_json("-x", f"{array}[]")),
        30,
    )
    assert [(c.work / f"out.{i}").read_text() for i in (1, 2)] == ["1\n", "2\n"]
    # qsub -W block=true of a job its walltime ends: 128 + SIGTERM, as a shell says.
    proc = c.run(
        "qsub", "-W", "block=true", "-l", "walltime=1", "--", "sleep", "30", check=False
    )
    assert proc.returncode == 143, proc.stderr


@pytest.mark.timeout(60)
def test_srun_starts_the_tasks_of_the_job(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=2)
    script = c.work / "mpi-style.slurm"
    script.write_text(
        "#!/bin/bash\n#SBATCH -n 2 -t 1\n"
        "srun -l sh -c 'echo rank $SLURM_PROCID of $SLURM_NTASKS on CPU $MB_CPU_LIST'\n"
        "srun -n 1 true\n"
    )
    env = {**c.env, "PATH": f"{BIN}:{c.env['PATH']}"}  # as after activating .venv
    job = c.run("sbatch", "--parsable", str(script), env=env).stdout.strip()
    record = c.wait_state(job, "completed", timeout=30)
    lines = sorted(Path(record["output_path"]).read_text().splitlines())
    cpus = record["cpus"]
    assert lines == [f"{i}: rank {i} of 2 on CPU {cpu}" for i, cpu in enumerate(cpus)]


@pytest.mark.timeout(60)
def test_a_killed_job_finds_why_in_its_error_file(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    pbs = c.qsub("-l", "walltime=1", "--", "sleep", "30")
    slurm = c.run(
        "sbatch", "--parsable", "-t", "0:01", "-e", "err-%j.txt", "--wrap", "sleep 30"
    ).stdout.strip()
    for job in (pbs, slurm):
        c.wait_state(job, "timeout", timeout=30)
    pbs_err = Path(c.job(pbs)["error_path"]).read_text()
    assert pbs_err == "=>> PBS: job killed: walltime of 1 s exceeded\n"
    slurm_err = (c.work / f"err-{slurm}.txt").read_text()
    assert slurm_err.startswith(
        f"slurmstepd: error: *** JOB {slurm} ON node0 CANCELLED AT "
    )
    assert slurm_err.endswith(" DUE TO TIME LIMIT ***\n")
