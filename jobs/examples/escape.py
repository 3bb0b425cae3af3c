#!/usr/bin/env python3
# PBS -N escape
# PBS -l ncpus=1,walltime=00:00:30
"""Start processes that try to outlive the job, then exit at once.

Three escapes, each a process that would sleep $ESCAPE_SECONDS (default 120):
``setsid`` (double fork, the grandchild in a new session, orphaned), ``nohup``
(a background ``nohup sleep``) and ``ignore-term`` (a child that ignores SIGTERM
and SIGHUP). The node daemon must still end them all with the job. Prints one
``escapee kind=setsid pid=1234`` line per process, then ``exit escapees=3``.

Run outside a batch system, they do outlive it: end them by the printed pids.
"""

import os
import signal
import sys
import time

SECONDS = float(os.environ.get("ESCAPE_SECONDS", "120"))


def fork() -> int:
    sys.stdout.flush()  # or the child would print the parent's buffer again
    return os.fork()


def sleep_and_exit() -> None:
    time.sleep(SECONDS)
    os._exit(0)


def double_fork_setsid() -> int:
    """The pid of a grandchild in its own session, whose parent has exited."""
    r, w = os.pipe()
    if fork() == 0:
        os.setsid()
        grandchild = fork()
        if grandchild == 0:
            os.close(w)  # else the parent's read would wait for it to end
            sleep_and_exit()
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as pipe:
        pid = int(pipe.read())
    os.wait()
    return pid


def nohup_sleep() -> int:
    return os.posix_spawnp("nohup", ["nohup", "sleep", f"{SECONDS:g}"], os.environ)


def ignore_term() -> int:
    pid = fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        sleep_and_exit()
    return pid


def main() -> int:
    escapes = [
        ("setsid", double_fork_setsid),
        ("nohup", nohup_sleep),
        ("ignore-term", ignore_term),
    ]
    for kind, start in escapes:
        print(f"escapee kind={kind} pid={start()}", flush=True)
    print(f"exit escapees={len(escapes)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
