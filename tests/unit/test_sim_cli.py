"""The simulation commands end to end on small generated traces."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from minibatch.cli import common, report
from minibatch.cli import sim as cli
from minibatch.core.job import Allocation, Job, JobRequest, JobResult, JobState
from minibatch.protocol import messages as m
from minibatch.sim import experiments
from minibatch.sim.experiments import Experiment, WorkloadSpec
from minibatch.sim.runner import MachineSpec
from minibatch.sim.swf import export_swf

REQUIRED_COLUMNS = [
    "job",
    "user",
    "submit",
    "start",
    "end",
    "procs",
    "req_time",
    "run_time",
    "wait",
    "predicted_start",
    "eet",
]
REQUIRED_SUMMARY = [
    "jobs",
    "mean_wait_s",
    "mean_response_s",
    "mean_slowdown",
    "mean_bounded_slowdown",
    "utilization",
    "makespan_s",
    "wall_s",
    "jobs_per_s",
]


def app() -> typer.Typer:
    a = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    a.command("sim")(cli.sim_command)
    a.command("report")(report.report_command)
    a.command("compare")(cli.compare_command)
    a.command("experiment")(cli.experiment_command)
    a.command("bench-sim")(cli.bench_sim)
    return a


def run(args: list[str]):
    return CliRunner().invoke(app(), args)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """300 jobs on a 16-processor machine (header MaxProcs 16), a busy queue."""
    rnd = random.Random(7)
    lines = ["; Computer: test", "; MaxProcs: 16", "; MaxNodes: 4"]
    t = 0
    for i in range(1, 301):
        t += rnd.randint(0, 40)
        run_time = rnd.randint(1, 400)
        procs = rnd.choice([1, 1, 2, 4, 8, 16])
        req = run_time * rnd.randint(1, 4)
        user, queue = rnd.randint(1, 6), rnd.randint(1, 3)
        lines.append(
            f"{i} {t} -1 {run_time} {procs} -1 -1 {procs} {req} 1024 1 {user} 1 -1 "
            f"{queue} -1 -1 -1"
        )
    lines.append("301 9999 -1 0 4 -1 -1 4 100 -1 0 1 1 -1 1 -1 -1 -1")  # run 0
    path = tmp_path / "small.swf"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sim_writes_jobs_csv_and_summary(trace, tmp_path):
    out = tmp_path / "run"
    result = run(["sim", str(trace), "--policy", "easy", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "16 procs" not in result.output  # the table, not the machine line
    rows = read_rows(out / "jobs.csv")
    assert list(rows[0])[: len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS
    assert len(rows) == 300  # the zero-length job is filtered out
    summary = json.loads((out / "summary.json").read_text())
    assert set(REQUIRED_SUMMARY) <= set(summary)
    assert summary["jobs"] == 300 and summary["machine_procs"] == 16  # from header
    waits = [float(r["wait"]) for r in rows]
    assert summary["mean_wait_s"] == pytest.approx(sum(waits) / len(waits))
    assert all(float(r["eet"]) > 0 for r in rows)
    assert any(r["predicted_start"] for r in rows)  # EASY predicts for heads
    assert summary["policy"] == "easy" and summary["estimates"] == "trace"


def test_an_output_path_that_cannot_be_a_directory_is_one_line(trace, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for command in (["sim"], ["compare"]):
        result = run([*command, str(trace), "--out", str(afile)])
        assert result.exit_code == 1, result.output
        assert "is not a directory" in result.output, result.output
        assert "Traceback" not in result.output


def test_sim_machine_options(trace, tmp_path):
    out = tmp_path / "nodes"
    result = run(
        ["sim", str(trace), "-p", "fifo", "--nodes", "4", "--cpus-per-node", "4",
         "--mem", "8mb", "--limit", "50", "--estimates", "exact", "--out", str(out)]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == 50 and summary["machine_nodes"][0] == ["n0", 4, 8192]
    rows = read_rows(out / "jobs.csv")
    assert all(r["req_time"] == r["run_time"] for r in rows)
    # 1024 KB per processor is a requirement now: 4 procs x 1 MB per node max 8 MB.
    assert {r["mem_kb"] for r in rows} >= {"1024", "4096"}
    wide = [r for r in rows if r["procs"] == "16"]
    assert wide and all(r["nodes"] == "n0+n1+n2+n3" for r in wide)
    bad = run(["sim", str(trace), "--nodes", "4", "--out", str(out)])
    assert bad.exit_code == 2 and "go together" in bad.output


def test_report_on_a_sim_directory_writes_plots(trace, tmp_path):
    out = tmp_path / "run"
    assert run(["sim", str(trace), "--out", str(out)]).exit_code == 0
    result = run(["report", str(out), "--by", "user", "--by", "size", "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "bounded slowdown" in result.output and "per user (6):" in result.output
    assert "per size" in result.output
    for name in ("gantt", "utilization", "eet_heatmap", "boxplots"):
        assert (out / f"{name}.png").is_file() and (out / f"{name}.svg").is_file()


def test_report_live_asks_the_server(monkeypatch, tmp_path):
    def job(id, submit, start, end, cpus):
        return Job(
            id=id,
            name="j",
            user="carol",
            uid=1,
            gid=1,
            group="g",
            workdir="/",
            request=JobRequest(ppn=len(cpus), walltime=100),
            submit_time=submit,
            state=JobState.FINISHED,
            result=JobResult.COMPLETED,
            start_time=start,
            end_time=end,
            alloc=[Allocation("node0", cpus)],
        )

    node = m.NodeInfo(
        name="node0", state="free", cpus=[0, 1], free_cpus=[0, 1], mem_kb=None, jobs={}
    )
    replies = [
        m.JobList(jobs=[job(1, 0.0, 0.5, 10.5, [0, 1]), job(2, 1.0, 10.5, 12.5, [0])]),
        m.NodeList(nodes=[node]),
    ]
    sent = []

    def fake(message, timeout=10.0):
        sent.append(message)
        return replies.pop(0)

    monkeypatch.setattr(common, "call", fake)
    out = tmp_path / "live"
    result = run(["report", "--live", "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert isinstance(sent[0], m.QueryJobs) and sent[0].finished
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == 2 and summary["mean_wait_s"] == pytest.approx(5.0)
    # 2 CPUs x 10 s + 1 CPU x 2 s over 2 CPUs x 12.5 s.
    assert summary["utilization"] == pytest.approx(22 / 25)
    assert run(["report"]).exit_code == 2


def test_compare_runs_every_policy_on_the_same_jobs(trace, tmp_path):
    out = tmp_path / "cmp"
    result = run(
        ["compare", str(trace), "--policies", "fifo,easy", "--out", str(out),
         "--no-plots"]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[1].split()
    assert header == ["metric", "fifo", "easy"]
    fifo = json.loads((out / "fifo" / "summary.json").read_text())
    easy = json.loads((out / "easy" / "summary.json").read_text())
    assert fifo["jobs"] == easy["jobs"] == 300
    assert easy["mean_wait_s"] <= fifo["mean_wait_s"]


def test_live_vs_sim_replays_an_exported_run(tmp_path):
    # A live FIFO run on 2 nodes x 2 CPUs: replayed under fifo, every start agrees.
    def job(id, submit, start, end, node, cpus):
        return Job(
            id=id,
            name="j",
            user="dave",
            uid=1000,
            gid=1000,
            group="g",
            workdir="/",
            request=JobRequest(ppn=len(cpus), walltime=600),
            submit_time=1000.0 + submit,
            state=JobState.FINISHED,
            result=JobResult.COMPLETED,
            start_time=1000.0 + start,
            end_time=1000.0 + end,
            alloc=[Allocation(node, cpus)],
        )

    jobs = [
        job(1, 0, 0, 30, "n0", [0, 1]),
        job(2, 1, 1, 20, "n1", [0, 1]),
        job(3, 2, 20, 50, "n1", [0, 1]),
        job(4, 3, 30, 40, "n0", [0]),
    ]
    path = tmp_path / "live.swf"
    path.write_text(export_swf(jobs, nodes=[("n0", 2), ("n1", 2)]))
    out = tmp_path / "lvs"
    result = run(
        ["compare", str(path), "--live-vs-sim", "--policy", "fifo", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "live_vs_sim.json").read_text())
    assert stats["jobs"] == 4 and stats["same_start"] == 4
    assert stats["max_abs_start_delta_s"] == 0
    rows = read_rows(out / "starts.csv")
    assert [r["delta"] for r in rows] == ["0", "0", "0", "0"]


def test_experiment_list_and_a_small_windowed_experiment(trace, tmp_path, monkeypatch):
    listed = run(["experiment", "--list"])
    assert listed.exit_code == 0 and "fcfs-vs-easy" in listed.output
    small = Experiment(
        name="tiny",
        title="tiny",
        description="two windows of 100 jobs",
        workloads=(WorkloadSpec("small", str(trace), MachineSpec(procs=16)),),
        policies=("fifo", "easy"),
        seeds=(1, 2),
        window=100,
    )
    monkeypatch.setitem(experiments.EXPERIMENTS, "tiny", small)
    out = tmp_path / "exp"
    result = run(["experiment", "tiny", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "results.md").read_text()
    assert "mb experiment tiny" in text and "2 windows of 100 jobs" in text
    for seed in (1, 2):
        assert (
            len(read_rows(out / "small" / f"seed{seed}" / "easy" / "jobs.csv")) == 100
        )
    again = tmp_path / "again"
    assert run(["experiment", "tiny", "--out", str(again)]).exit_code == 0
    # Bit for bit the same schedules (summaries differ only in wall times).
    for seed in (1, 2):
        part = Path("small") / f"seed{seed}" / "easy" / "jobs.csv"
        assert (again / part).read_bytes() == (out / part).read_bytes()
    assert run(["experiment", "nope"]).exit_code == 2


def test_bench_sim_reports_speed_and_agrees_with_the_bare_loop(trace):
    result = run(["bench-sim", str(trace), "--repeat", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["jobs"] == 300 and data["jobs_per_s"] > 0
    assert data["bare_same_schedule"] is True
