"""``qstat -f`` lines for a job's submission options, in PBS's attribute names
where PBS has one, so nothing a script asked for is hidden (recorded options
included, with the values given)."""

from __future__ import annotations

from minibatch.core.job import Job
from minibatch.core.units import format_duration, format_size_kb


def option_attrs(job: Job) -> list[tuple[str, str | None]]:
    opts = job.options
    req = job.request

    warn = None
    if opts.warn_signal:
        where = "B:" if opts.warn_shell_only else ""
        warn = f"{where}{opts.warn_signal}@{opts.warn_seconds}"
    attrs: list[tuple[str, str | None]] = [
        ("Account_Name", job.account or None),
        ("project", opts.project or None),
        ("Priority", str(opts.priority) if opts.priority else None),
        ("Rerunable", "True" if opts.rerunnable else "False"),
        ("Shell_Path_List", opts.shell or None),
        ("Keep_Files", opts.keep or None),
        ("umask", None if opts.umask is None else f"{opts.umask:04o}"),
        ("Mail_Points", opts.mail_points or "n"),
        ("Mail_Users", ",".join(opts.mail_users) or None),
        ("job_args", " ".join(opts.script_args) or None),
        ("group_list", opts.group or None),
        ("Resource_List.gpus", str(req.gpus) if req.gpus else None),
        ("Resource_List.feature", ":".join(opts.features) or None),
        ("Resource_List.cput", format_duration(opts.cput) if opts.cput else None),
        ("Resource_List.pmem", format_size_kb(opts.pmem_kb) if opts.pmem_kb else None),
        ("Resource_List.vmem", format_size_kb(opts.vmem_kb) if opts.vmem_kb else None),
        ("signal", warn),
        ("array_slot_limit", str(opts.array_limit) if opts.array_limit else None),
        ("run_count", str(job.reruns + (job.start_time is not None))),
    ]
    if opts.ntasks or opts.cpus_per_task or opts.tasks_per_node:
        attrs.append(
            (
                "slurm_tasks",
                f"ntasks={opts.ntasks or '-'} cpus_per_task={opts.cpus_per_task or '-'}"
                f" ntasks_per_node={opts.tasks_per_node or '-'}",
            )
        )
    attrs += [
        (f"recorded.{name}", value or "(set)") for name, value in opts.recorded.items()
    ]
    return attrs
