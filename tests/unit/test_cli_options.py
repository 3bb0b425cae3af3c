"""The whole qsub/sbatch option set: what is honoured, what is recorded with a
note, and what is refused (only malformed values and contradictions)."""

from __future__ import annotations

import signal
import time

import pytest

from minibatch.cli.directives import Context, parse_directives
from minibatch.cli.optvalues import (
    parse_depend,
    parse_env_list,
    parse_pbs_date,
    parse_slurm_begin,
)
from minibatch.cli.qsub import make_spec
from minibatch.cli.sbatch import make_spec as sbatch_spec
from minibatch.cli.submission import to_request
from minibatch.core.job import Dependency, DependKind
from minibatch.errors import InvalidArgument

ENV = {"HOME": "/home/alice", "PATH": "/usr/bin", "USER": "alice"}
NOW = time.mktime((2026, 11, 24, 10, 0, 0, 0, 0, -1))
CTX = Context(ENV, NOW, mail=False, user="alice")


def directives(text: str):
    return parse_directives(text, "job.sh", CTX)


def qsub(tmp_path, text: str, *argv: str):
    script = tmp_path / "job.sh"
    script.write_text(text)
    made = make_spec(
        [*argv, str(script)],
        environ=ENV,
        workdir=str(tmp_path),
        host="ws",
        user="alice",
        now=NOW,
        mail=False,
    )
    assert made is not None
    return made


def sbatch(tmp_path, text: str, *argv: str, after: tuple[str, ...] = ()):
    script = tmp_path / "s.sh"
    script.write_text(text)
    made = sbatch_spec(
        [*argv, str(script), *after],
        environ=ENV,
        workdir=str(tmp_path),
        host="ws",
        user="alice",
        now=NOW,
    )
    assert made is not None
    return made


def test_torque_nodes_with_gpus_and_properties():
    opts = directives("#PBS -l nodes=2:ppn=16:gpus=1:xe\n")
    assert (opts.nodes, opts.ppn, opts.gpus, opts.features) == (2, 16, 1, ["xe"])
    opts = directives("#PBS -l nodes=1:ppn=4+2:ppn=2\n")
    assert (opts.nodes, opts.ppn) == (3, 4)
    assert any("run as 3 nodes of 4 CPUs" in n for n in opts.notes)


def test_pbs_pro_select_place_and_project():
    opts = directives(
        "#PBS -l select=2:ncpus=8:mpiprocs=8:ngpus=1:mem=4gb\n"
        "#PBS -l place=scatter:excl\n#PBS -P climate\n"
    )
    assert (opts.nodes, opts.ppn, opts.gpus, opts.mem_kb) == (2, 8, 1, 8 * 1024**2)
    assert opts.recorded["place"] == "scatter:excl"
    assert opts.recorded["mpiprocs"] == "8"
    assert opts.project == "climate"


def test_recorded_options_say_why():
    opts = directives(
        "#PBS -m abe -M a@b.c\n#PBS -c enabled -W stagein=x@h:/y\n"
        "#PBS -l mppwidth=64,file=10gb\n#PBS -W group_list=hpc\n"
    )
    assert opts.mail_points == "abe" and opts.mail_users == ["a@b.c"]
    assert any("no sendmail" in n for n in opts.notes)
    assert set(opts.recorded) >= {"-c", "stagein", "mppwidth", "file"}
    assert opts.group == "hpc"
    assert all(": " in n for n in opts.notes)


def test_honoured_pbs_options():
    opts = directives(
        "#PBS -S /bin/bash -r n -k oe -W umask=027 -p -10\n"
        "#PBS -l cput=01:00:00,pmem=1gb,vmem=2gb\n#PBS -t 1-10%2\n"
        "#PBS -W block=true -a 1130 -d /tmp\n"
    )
    assert (opts.shell, opts.rerunnable, opts.keep) == ("/bin/bash", False, "oe")
    assert (opts.umask, opts.priority, opts.cput) == (0o27, -10, 3600)
    assert (opts.pmem_kb, opts.vmem_kb) == (1024**2, 2 * 1024**2)
    assert (opts.array, opts.array_limit) == (list(range(1, 11)), 2)
    assert opts.block and opts.workdir == "/tmp"
    assert opts.begin == NOW + 5400


def test_sbatch_abbreviations_spaces_and_comments():
    opts = directives(
        "#!/bin/bash\n"
        "#SBATCH --time 00:30:00   # don't change this, it's the queue's limit\n"
        "#SBATCH --cpus-per-t=4 --ntasks-per-node 2 -N 2\n"
        "#SBATCH --mem-per-cpu=1G --mail-t=END,FAIL --mail-user=me@x\n"
        "#SBATCH -C gpu -p debug,short --signal=B:USR1@120 --no-requeue\n"
        "#SBATCH --gres=gpu:2 --exclusive --hint=nomultithread\n"
    )
    assert opts.walltime == 1800
    req = to_request(opts)
    assert (req.nodes, req.ppn, req.mem_kb, req.gpus) == (2, 8, 16 * 1024**2, 2)
    assert opts.mail_points == "ae" and opts.features == ["gpu"]
    assert opts.queues == ["debug", "short"]
    assert opts.warn == (signal.SIGUSR1.value, 120, True)
    assert opts.rerunnable is False
    assert set(opts.recorded) == {"--exclusive", "--hint"}


def test_slurm_ntasks_per_node_sets_the_node_count():
    req = to_request(directives("#SBATCH --ntasks=8 --ntasks-per-node=4\n"))
    assert (req.nodes, req.ppn) == (2, 4)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now+60", NOW + 60),
        ("now+2hours", NOW + 7200),
        ("16:00", NOW + 6 * 3600),
        ("09:00", NOW + 23 * 3600),
        ("2026-11-25T08:30", time.mktime((2026, 11, 25, 8, 30, 0, 0, 0, -1))),
        ("tomorrow", time.mktime((2026, 11, 25, 0, 0, 0, 0, 0, -1))),
        ("teatime", NOW + 6 * 3600),
    ],
)
def test_slurm_begin(text, expected):
    assert parse_slurm_begin(text, NOW) == expected


def test_pbs_dates():
    assert parse_pbs_date("1130", NOW) == NOW + 5400
    assert parse_pbs_date("0930", NOW) == NOW + 23.5 * 3600
    assert parse_pbs_date("202612010800", NOW) == time.mktime(
        (2026, 12, 1, 8, 0, 0, 0, 0, -1)
    )
    with pytest.raises(InvalidArgument):
        parse_pbs_date("2613", NOW)


def test_array_dependencies():
    assert parse_depend("afterokarray:5[]") == [Dependency(DependKind.AFTEROK, 5, True)]
    assert parse_depend("afterok:5[]") == parse_depend("afterokarray:5")
    assert parse_depend("afterok:5[3]") == parse_depend("afterok:5_3")
    assert parse_depend("afterok:5_3")[0].task == 3


def test_spec_options_paths_and_account(tmp_path):
    (tmp_path / "logs").mkdir()
    spec, _ = qsub(
        tmp_path,
        "#PBS -o ws:logs/ -e logs/err.^array_index^ -J 1-4 -P proj -F 'a b'\ntrue\n",
    )
    assert spec.stdout_path == f"{tmp_path}/logs/"
    assert spec.stderr_path == f"{tmp_path}/logs/err.^array_index^"
    assert spec.account == "proj" and spec.options.project == "proj"
    assert spec.options.script_args == ["a", "b"]
    spec, _ = qsub(tmp_path, "#PBS -A acct -P proj\ntrue\n")
    assert spec.account == "acct"


def test_missing_directories_are_refused_at_submission(tmp_path):
    with pytest.raises(InvalidArgument, match="directory .*/nope does not exist"):
        qsub(tmp_path, "#PBS -o nope/out.txt\ntrue\n")
    with pytest.raises(InvalidArgument, match="working directory nope does not exist"):
        qsub(tmp_path, "#PBS -d nope\ntrue\n")
    # A directory filled in per job is checked when the job starts.
    spec, _ = qsub(tmp_path, "#SBATCH -o %u/%j.out\ntrue\n")
    assert spec.stdout_path == f"{tmp_path}/%u/%j.out"


def test_directive_prefix(tmp_path):
    spec, _ = qsub(tmp_path, "#MY -N custom\n#PBS -N ignored\ntrue\n", "-C", "#MY")
    assert spec.name == "custom"


def test_sbatch_command_line(tmp_path):
    text = "#!/bin/bash\n#SBATCH -n 2\n#PBS -N frompbs\necho\n"
    spec, _ = sbatch(tmp_path, text, "--export=NONE,X=1", "-J", "cli", after=("arg1",))
    assert spec.name == "cli" and spec.request.ppn == 2
    assert "PATH" not in spec.env and spec.env["X"] == "1"
    assert spec.options.script_args == ["arg1"] and spec.options.slurm
    with pytest.raises(InvalidArgument, match="first line must start with #!"):
        (tmp_path / "bad.sh").write_text("echo\n")
        sbatch_spec([str(tmp_path / "bad.sh")], environ=ENV, workdir=str(tmp_path))


def test_slurm_gpu_forms_and_export_lists():
    req = to_request(directives("#SBATCH -N 2 --gpus=3\n"))
    assert req.gpus == 2  # 3 for the job: 2 on each of its 2 nodes
    opts = directives("#SBATCH --mem-per-gpu=1G -n 2 --gpus-per-task=1\n")
    req = to_request(opts)
    assert (req.gpus, req.mem_kb) == (2, 2 * 1024**2)
    assert directives("#SBATCH --export=A=1\n").export_all is False
    assert directives("#SBATCH --export=ALL,A=1\n").export_all is True
    assert to_request(directives("#PBS -l gres=gpu:2\n")).gpus == 2


def test_torque_oddities():
    opts = directives("#PBS -l nodes=1:ppn=4#excl\n#PBS -l feature=a|b\n")
    assert opts.ppn == 4 and opts.recorded["nodes#"] == "excl"
    assert "feature" in opts.recorded and not opts.features
    with pytest.raises(InvalidArgument, match="jobs run as their submitter"):
        directives("#PBS -u bob\n")
    assert directives("#PBS -q @server\n").queues is None


def test_the_last_gaps_of_the_reference_option_sets():
    opts = directives("#PBS -i 2\n#SBATCH --oom-kill-step --workdir=/tmp\n")
    assert "-i" in opts.recorded and "--oom-kill-step" in opts.recorded
    assert opts.workdir == "/tmp"
    assert parse_slurm_begin("112526", NOW) == time.mktime(
        (2026, 11, 25, 0, 0, 0, 0, 0, -1)
    )


def test_slurm_memory_options_are_one_request(tmp_path):
    """sbatch's rule: --mem, --mem-per-cpu and --mem-per-gpu exclude each other
    where they are given together; the command line's replaces the script's."""
    with pytest.raises(InvalidArgument, match="mutually exclusive"):
        directives("#SBATCH --mem=40M --mem-per-cpu=40M\n")
    with pytest.raises(InvalidArgument, match="mutually exclusive"):
        directives("#SBATCH --mem-per-gpu=1G\n#SBATCH --mem=2G\n")
    assert to_request(directives("#SBATCH --mem=1G\n#SBATCH --mem=2G\n")).mem_kb == (
        2 * 1024**2
    )

    def submitted_mem(text: str, option: str) -> int | None:
        return sbatch(tmp_path, f"#!/bin/sh\n{text}\ntrue\n", option)[0].request.mem_kb

    assert submitted_mem("#SBATCH -n 2 --mem=1G", "--mem-per-cpu=100M") == 200 << 10
    # --mem=0 (no limit) on the command line replaces the script's too.
    assert submitted_mem("#SBATCH -n 2 --mem-per-cpu=1G", "--mem=0") is None


def test_cpu_requests_of_one_layer_must_agree(tmp_path):
    """Two different CPU resources asking otherwise is a contradiction; the
    same resource again, or the command line over the script, replaces it."""
    with pytest.raises(InvalidArgument, match="nodes=1:ppn=2 and ncpus=1"):
        directives("#PBS -l nodes=1:ppn=2,ncpus=1\n")
    with pytest.raises(InvalidArgument, match="procs=4 and select=2:ncpus=2"):
        directives("#PBS -l procs=4\n#PBS -l select=2:ncpus=2\n")
    agree = directives("#PBS -l nodes=1:ppn=4\n#PBS -l ncpus=4\n")
    assert (agree.nodes, agree.ppn) == (1, 4)
    again = directives("#PBS -l ncpus=2\n#PBS -l ncpus=8\n")
    assert (again.nodes, again.ppn) == (1, 8)
    # Against every other one given, not only the last.
    with pytest.raises(InvalidArgument, match="nodes=1:ppn=2 and ncpus=4"):
        directives("#PBS -l nodes=1:ppn=2,ncpus=2,ncpus=4\n")

    def submitted(text: str, *argv: str) -> tuple[int, int]:
        req = qsub(tmp_path, f"#!/bin/sh\n{text}\ntrue\n", *argv)[0].request
        return req.nodes, req.ppn

    assert submitted("#PBS -l nodes=2:ppn=4", "-l", "ncpus=3") == (1, 3)
    # A nodes= request on the command line is not spread by the script's procs=.
    assert submitted("#PBS -l procs=8", "-l", "nodes=1:ppn=2") == (1, 2)
    with pytest.raises(InvalidArgument, match="contradictory CPU requests"):
        qsub(tmp_path, "#!/bin/sh\ntrue\n", "-l", "ncpus=2", "-l", "nodes=2")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("C='p,q',D=1,E", {"C": "p,q", "D": "1", "E": "from-env"}),  # PBS Pro's way
        ('C="p,q"', {"C": "p,q"}),
        ("A=it's,B=2", {"A": "it's", "B": "2"}),  # an apostrophe, not a quote
        ("A=1,B=", {"A": "1", "B": ""}),
        ("MSG=don't,OTHER=can't", {"MSG": "don't", "OTHER": "can't"}),
    ],
)
def test_variable_values_in_quotes_may_hold_commas(text, want):
    """qsub -v / sbatch --export values with commas, quoted (found by a
    new-user trial: they were refused as malformed)."""
    assert parse_env_list(text, {"E": "from-env"}) == want


def test_a_negative_node_count_is_refused_not_taken_for_a_host(tmp_path):
    with pytest.raises(
        InvalidArgument, match="nodes must be a positive count, got '-1'"
    ):
        qsub(tmp_path, "true\n", "-l", "nodes=-1")
    with pytest.raises(
        InvalidArgument, match="--nodes must be a positive integer, got '-1'"
    ):
        sbatch(tmp_path, "#!/bin/sh\ntrue\n", "--nodes=-1")
    # A name is a host (a property here), as Torque reads it.
    spec, _ = qsub(tmp_path, "true\n", "-l", "nodes=abc")
    assert spec.request.nodes == 1


def test_an_absurd_walltime_is_refused_naming_it(tmp_path):
    long = "100000000000000000000"
    with pytest.raises(InvalidArgument, match=f"duration '{long}' is longer than 100"):
        qsub(tmp_path, "true\n", "-l", f"walltime={long}")
    spec, _ = qsub(tmp_path, "true\n", "-l", "walltime=240:00:00")
    assert spec.request.walltime == 240 * 3600
