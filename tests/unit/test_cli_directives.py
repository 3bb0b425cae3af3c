"""qsub's input side: #PBS/#SBATCH directives, the command line, and the JobSpec."""

from __future__ import annotations

import io

import pytest

from minibatch.cli.directives import Context, SubmitOptions, merge, parse_directives
from minibatch.cli.optvalues import parse_array, parse_depend
from minibatch.cli.qsub import make_spec, parse_args
from minibatch.cli.slurmopts import parse_mem as parse_slurm_mem
from minibatch.cli.slurmopts import parse_time as parse_slurm_time
from minibatch.cli.submission import build_spec, to_request
from minibatch.core.job import Dependency, DependKind, JobRequest
from minibatch.errors import InvalidArgument

ENV = {"HOME": "/home/alice", "PATH": "/usr/bin", "SHELL": "/bin/bash", "FOO": "foo"}
CTX = Context(ENV, 1_800_000_000.0)


def directives(text: str) -> SubmitOptions:
    return parse_directives(text, "job.sh", CTX)


def spec_for(argv: list[str], **kw):
    made = make_spec(argv, environ=ENV, workdir="/work", host="ws", user="alice", **kw)
    return None if made is None else made[0]


def write(tmp_path, text: str, name: str = "job.sh") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- #PBS


def test_pbs_directives_set_every_option():
    opts = directives(
        "#!/bin/bash\n"
        "#PBS -N hello\n"
        "#PBS -l nodes=2:ppn=4\n"
        "#PBS -l walltime=1:30:00,mem=2gb\n"
        "#PBS -j oe -o out.txt -e /abs/err.txt\n"
        "#PBS -W depend=afterok:1:2.server,afterany:3\n"
        "#PBS -t 1-3,5\n"
        "#PBS -v A=1,FOO\n"
        "#PBS -h -V -q batch\n"
        "echo hi\n"
    )
    assert (opts.name, opts.nodes, opts.ppn) == ("hello", 2, 4)
    assert (opts.walltime, opts.mem_kb) == (5400, 2 * 1024 * 1024)
    assert opts.join == "oe"
    assert (opts.stdout_path, opts.stderr_path) == ("out.txt", "/abs/err.txt")
    assert opts.depends == [
        Dependency(DependKind.AFTEROK, 1),
        Dependency(DependKind.AFTEROK, 2),
        Dependency(DependKind.AFTERANY, 3),
    ]
    assert opts.array == [1, 2, 3, 5]
    assert opts.env == {"A": "1", "FOO": "foo"}
    assert opts.hold and opts.export_all


def test_directives_stop_at_the_first_command():
    opts = directives(
        "#!/bin/sh\n\n# a comment\n   # indented comment\n#PBS -N early\n"
        "echo start\n#PBS -N late\n"
    )
    assert opts.name == "early"


def test_directive_prefix_must_be_exact():
    assert directives("# PBS -N x\n#PBSX -N y\n#pbs -N z\ntrue\n").name is None


def test_trailing_comment_and_quotes():
    opts = directives('#PBS -N run#2 # the second run\n#PBS -v "MSG=a b"\n')
    assert opts.name == "run#2"
    assert opts.env == {"MSG": "a b"}


def test_ncpus_select_and_host_paths():
    assert (
        directives("#PBS -l ncpus=3\n").nodes,
        directives("#PBS -l ncpus=3\n").ppn,
    ) == (1, 3)
    opts = directives("#PBS -l select=2:ncpus=4:mem=1gb\n#PBS -o ws:/tmp/o\n")
    assert (opts.nodes, opts.ppn, opts.mem_kb) == (2, 4, 2 * 1024 * 1024)
    assert opts.stdout_path == "ws:/tmp/o"  # the host goes when the spec is built
    assert directives("#PBS -l select=ncpus=2\n").ppn == 2
    assert directives("#PBS -l nodes=3\n").ppn == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#PBS -Z foo", "unknown option -Z"),
        ("#PBS -l ncpus=0", "ncpus must be a positive integer"),
        ("#PBS -l ncpus=two", "ncpus must be a positive integer"),
        ("#PBS -l nodes=:ppn=2", "malformed nodes="),
        ("#PBS -l select=1:mpiprocs", "malformed select resource"),
        ("#PBS -l walltime=0", "duration must be positive"),
        ("#PBS -l walltime=1h", "malformed duration"),
        ("#PBS -l mem=lots", "malformed size"),
        ("#PBS -l mem=0", "size must be positive"),
        ("#PBS -l ncpus=", "malformed resource"),
        ("#PBS -l walltime", "malformed resource"),
        ("#PBS -j xy", "expected oe, eo or n"),
        ("#PBS -W umask=099", "expected an octal mask"),
        ("#PBS -W umask", "malformed -W attribute"),
        ("#PBS -r maybe", "takes y or n"),
        ("#PBS -p 5000", "between -1024 and 1023"),
        ("#PBS -a tomorrow", "malformed date"),
        ("#PBS -m xyz", "expected n or letters"),
        ("#PBS -k q", "expected a mix of o, e, d"),
        ("#PBS -I", "interactive jobs: not supported"),
        ("#PBS -t 1-3 -J 1-3", "-J and -t both give an array"),
        ("#PBS -W depend=before:3", "unsupported dependency type 'before'"),
        ("#PBS -W depend=afterok", "names no job"),
        ("#PBS -W depend=afterok:abc", "malformed job id 'abc'"),
        ("#PBS -t 5-1", "malformed array range"),
        ("#PBS -t 0-99%x", "slot limit"),
        ("#PBS -t x", "malformed array range"),
        ("#PBS -v 1X=2", "malformed variable"),
        ("#PBS -q 'a b'", "invalid queue"),
        ("#PBS -N 'a b'", "invalid job name"),
        ("#PBS -N " + "n" * 237, "job name too long (237 characters, at most 236)"),
        ("#PBS -N", "option -N needs a value"),
        ("#PBS extra", "unexpected argument 'extra'"),
        ("#PBS -N 'open", "No closing quotation"),
        ("#PBS --mem=1", "unknown option --mem"),
        ("#PBS -C X", "-C is a command-line option"),
    ],
)
def test_bad_pbs_directive_names_the_line(line, message):
    with pytest.raises(InvalidArgument) as err:
        directives(f"#!/bin/sh\n#PBS -N ok\n{line}\necho\n")
    assert str(err.value).startswith("job.sh line 3: ")
    assert message in str(err.value)


# -------------------------------------------------------------- #SBATCH


def test_sbatch_long_and_short_forms():
    opts = directives(
        "#!/bin/bash\n"
        "#SBATCH --job-name=sim\n"
        "#SBATCH -o sim.out --error sim.err\n"
        "#SBATCH --time=1-02:00:00\n"
        "#SBATCH -n 4 --cpus-per-task=2\n"
        "#SBATCH --mem=500\n"
        "#SBATCH --array=0-10:5 -d afterok:7 -H -p batch\n"
    )
    assert (opts.name, opts.stdout_path, opts.stderr_path) == (
        "sim",
        "sim.out",
        "sim.err",
    )
    assert opts.walltime == 86400 + 7200
    assert to_request(opts) == JobRequest(
        nodes=1, ppn=8, mem_kb=500 * 1024, walltime=93600
    )
    assert opts.queues == ["batch"]
    assert opts.array == [0, 5, 10]
    assert opts.depends == [Dependency(DependKind.AFTEROK, 7)]
    assert opts.hold and opts.slurm


def test_a_slurm_job_name_may_hold_spaces():
    assert directives('#SBATCH --job-name="my job"\n').name == "my job"
    with pytest.raises(InvalidArgument, match="no other blanks"):
        directives("#SBATCH --job-name='a\tb'\n")


def test_sbatch_attached_short_values_and_nodes():
    opts = directives("#SBATCH -Jx -N2 -n8\n")
    assert opts.name == "x"
    assert (to_request(opts).nodes, to_request(opts).ppn) == (2, 4)
    # Tasks that do not divide evenly round up per node.
    assert to_request(directives("#SBATCH -N 2 -n 3 -c 2\n")).ppn == 4


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("5:30", 330), ("1:00:00", 3600), ("2-0", 172800)]
    + [("1-1:30", 91800), ("1-0:0:5", 86405)],
)
def test_slurm_time_formats(text, seconds):
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize(
    "text", ["0", "UNLIMITED", "1:2:3:4", "-5", "a-1", "1-2:3:4:5", "", "infinite"]
)
def test_slurm_time_rejects(text):
    with pytest.raises(InvalidArgument):
        parse_slurm_time(text)


def test_slurm_mem_units():
    assert parse_slurm_mem("500") == 500 * 1024
    assert parse_slurm_mem("4G") == 4 * 1024 * 1024
    assert parse_slurm_mem("64k") == 64
    assert parse_slurm_mem("2MB") == 2048
    assert parse_slurm_mem("0") == 0  # the whole node: recorded, no limit
    for bad in ("4X", "-1", "lots"):
        with pytest.raises(InvalidArgument):
            parse_slurm_mem(bad)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#SBATCH --frobnicate", "unknown option --frobnicate"),
        ("#SBATCH -y node1", "unknown option -y"),
        ("#SBATCH --mem-per", "ambiguous"),
        ("#SBATCH --ntasks=0", "--ntasks must be a positive integer"),
        ("#SBATCH --nodes=x-2", "--nodes must be a positive integer"),
        ("#SBATCH --signal=FOO@60", "unknown signal"),
        ("#SBATCH --open-mode=sideways", "append or truncate"),
        ("#SBATCH --help", "command-line option"),
        ("#SBATCH --time", "needs a value"),
        ("#SBATCH --hold=yes", "takes no value"),
        ("#SBATCH --dependency=afterok:1?afterok:2", "any-of"),
        ("#SBATCH --dependency=singleton", "unsupported dependency type"),
        ("#SBATCH stray", "unexpected argument"),
    ],
)
def test_bad_sbatch_directive_names_the_line(line, message):
    with pytest.raises(InvalidArgument) as err:
        directives(f"{line}\n")
    assert str(err.value).startswith("job.sh line 1: ")
    assert message in str(err.value)


def test_value_parsers():
    assert parse_array("3,1-2,2") == ([1, 2, 3], 0)
    assert parse_array("0-15%4") == (list(range(16)), 4)
    assert parse_depend("afterok:1:1,afternotok:2") == [
        Dependency(DependKind.AFTEROK, 1),
        Dependency(DependKind.AFTERNOTOK, 2),
    ]
    with pytest.raises(InvalidArgument, match="more than"):
        parse_array("0-999999999")


# ------------------------------------------------------ the command line


def test_qsub_argv_options_operands_and_help():
    args = parse_args(["-hV", "-lncpus=2", "-Nx", "-l", "walltime=60", "job.sh"], CTX)
    assert args.options.hold and args.options.export_all
    assert (args.options.ppn, args.options.name, args.options.walltime) == (2, "x", 60)
    assert (args.operands, args.command, args.help) == (["job.sh"], False, False)
    args = parse_args(["-N", "x", "--", "sleep", "-h"], CTX)
    assert (args.operands, args.command) == (["sleep", "-h"], True)
    assert parse_args(["--help"], CTX).help


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-Z"], "unknown option -Z"),
        (["--name", "x"], "unknown option --name"),
        (["-l"], "option -l needs a value"),
        (["-l", "ncpus=-1"], "positive integer"),
    ],
)
def test_qsub_argv_errors(argv, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_args(argv, CTX)


def test_command_line_overrides_directives_field_by_field(tmp_path):
    script = write(
        tmp_path, "#PBS -N fromscript -l ncpus=2,walltime=100 -v A=1,B=2\ntrue\n"
    )
    spec = spec_for(["-N", "cli", "-l", "walltime=200", "-v", "B=3", script])
    assert spec.name == "cli"
    assert spec.request == JobRequest(nodes=1, ppn=2, walltime=200)
    assert (spec.env["A"], spec.env["B"]) == ("1", "3")
    # A nodes/ncpus request replaces the lower layer's CPU request whole.
    script = write(tmp_path, "#PBS -l nodes=2:ppn=2\ntrue\n", "two.sh")
    assert spec_for(["-l", "ncpus=4", script]).request.cpus == 4


def test_spec_from_script_file(tmp_path):
    text = "#!/bin/sh\n#PBS -o out\necho hi\n"
    spec = spec_for(["-h", write(tmp_path, text, "work.sh")])
    assert spec is not None
    assert (spec.name, spec.script, spec.argv) == ("work.sh", text, None)
    assert spec.workdir == "/work"
    assert spec.stdout_path == "/work/out"
    assert not spec.walltime_given
    assert spec.stderr_path is None
    assert spec.hold and not spec.join
    # Unset walltime is sent as JobRequest's default, which the server replaces.
    assert spec.request.walltime == JobRequest().walltime
    assert spec.env == {
        "PBS_O_HOME": "/home/alice",
        "PBS_O_PATH": "/usr/bin",
        "PBS_O_SHELL": "/bin/bash",
        "PBS_O_WORKDIR": "/work",
        "PBS_O_HOST": "ws",
        "PBS_O_LOGNAME": "alice",
        "PBS_O_QUEUE": "batch",
    }
    assert spec.submit_args.startswith("-h ")


def test_spec_from_command():
    spec = spec_for(["-t", "1-2", "-W", "depend=afterany:4", "--", "/bin/sleep", "10"])
    assert spec is not None
    assert (spec.name, spec.argv, spec.script) == ("sleep", ["/bin/sleep", "10"], None)
    assert spec.array == [1, 2]
    assert spec.depends == [Dependency(DependKind.AFTERANY, 4)]


def test_whole_environment_with_V_and_v_wins():
    spec = spec_for(["-V", "-v", "FOO=over", "--", "env"])
    assert spec is not None
    assert spec.env["PATH"] == "/usr/bin"
    assert spec.env["FOO"] == "over"
    assert spec.env["PBS_O_WORKDIR"] == "/work"


def test_sbatch_script_joins_stderr_unless_error_given(tmp_path):
    joined = spec_for([write(tmp_path, "#SBATCH -o x.out\ntrue\n")])
    split = spec_for([write(tmp_path, "#SBATCH -o x.out -e x.err\ntrue\n", "b.sh")])
    assert joined is not None and split is not None
    assert joined.join and not split.join
    assert split.stderr_path == "/work/x.err"
    # Slurm's default name, filled in by the server, and its whole environment.
    default = spec_for([write(tmp_path, "#SBATCH -n 2\ntrue\n", "c.sh")])
    assert default.stdout_path == "/work/slurm-%j.out" and default.join
    assert default.env["FOO"] == "foo"


def test_script_from_stdin():
    spec = spec_for([], stdin=io.StringIO("#PBS -N piped\necho\n"))
    assert spec is not None and spec.name == "piped"
    spec = spec_for([], stdin=io.StringIO("echo\n"))
    assert spec is not None and spec.name == "STDIN"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/nonexistent/job.sh"], "cannot read script /nonexistent/job.sh"),
        (["--"], "no command after --"),
        (["a.sh", "b.sh"], "unexpected argument 'b.sh'"),
        ([], "no script given"),
    ],
)
def test_spec_errors(argv, message):
    with pytest.raises(InvalidArgument, match=message):
        spec_for(argv)


def test_empty_or_binary_script(tmp_path):
    with pytest.raises(InvalidArgument, match="is empty"):
        spec_for([write(tmp_path, "\n\n")])
    binary = tmp_path / "a.out"
    binary.write_bytes(b"\x7fELF\xff\xfe\x00")
    with pytest.raises(InvalidArgument, match="not a text file"):
        spec_for([str(binary)])


def test_help_returns_no_spec():
    assert spec_for(["--help"]) is None


def test_merge_keeps_lower_layer_when_higher_is_unset():
    low = SubmitOptions(name="a", walltime=5, env={"X": "1"}, slurm=True)
    high = SubmitOptions(walltime=7, env={"Y": "2"})
    out = merge(low, high)
    assert (out.name, out.walltime, out.env, out.slurm) == (
        "a",
        7,
        {"X": "1", "Y": "2"},
        True,
    )


def test_build_spec_uses_default_name():
    spec = build_spec(
        SubmitOptions(), default_name="x", cwd="/w", environ={}, host="h", user="u"
    )
    assert spec.name == "x" and spec.depends == [] and spec.array is None
