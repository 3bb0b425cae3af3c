"""Job mail (``qsub -m abe -M``, ``--mail-type``), handed to the local sendmail.

The state machine decides *what* to send (:func:`letter_for`, :func:`message`);
:class:`Mailer` hands each message to ``sendmail -t`` without waiting for it, so
a slow mail system never holds up the server. With no sendmail, nothing is sent
(qsub said so with a note at submission).
"""

from __future__ import annotations

import logging
import os
import subprocess
from email.message import EmailMessage

from minibatch.core.job import Job, JobResult

log = logging.getLogger(__name__)

SENDMAIL = ("/usr/sbin/sendmail", "/usr/lib/sendmail")
#: Children still being waited for, at most: beyond, mail is dropped (logged).
_MAX_PENDING = 64


#: Ends PBS calls an abort: the batch system, not the job, ended it.
_ABORTS = frozenset(
    {
        JobResult.TIMEOUT,
        JobResult.OUT_OF_MEMORY,
        JobResult.NODE_FAIL,
        JobResult.CANCELLED,
    }
)


def letters_for(job: Job, event: str) -> str:
    """The ``-m`` letters a job event answers to: b at the start, e at any end,
    a (also) when the batch system ended it."""
    if event == "started":
        return "b"
    if event == "finished":
        return "ae" if job.result in _ABORTS else "e"
    return ""


def message(job: Job, letter: str, host: str) -> EmailMessage:
    """The mail PBS sends, in its words."""
    what = {"b": "Begun execution", "e": "Execution terminated", "a": "Aborted"}
    msg = EmailMessage()
    msg["To"] = ", ".join(job.options.mail_users or [job.user])
    msg["From"] = f"minibatch@{host}"
    msg["Subject"] = f"PBS JOB {job.display_id}"
    lines = [
        f"PBS Job Id: {job.display_id}",
        f"Job Name:   {job.name}",
        f"Queue:      {job.queue}",
        what[letter],
    ]
    if job.result is not None:
        lines.append(f"Exit_status={job.exit_status}  result={job.result.value}")
        if job.comment:
            lines.append(job.comment)
    msg.set_content("\n".join(lines) + "\n")
    return msg


class Mailer:
    """Args:
    path: the sendmail to run ("" = the first of :data:`SENDMAIL` present).
    """

    def __init__(self, path: str = "") -> None:
        found = (p for p in SENDMAIL if os.access(p, os.X_OK))
        self.path = path or next(found, None)
        self._children: list[subprocess.Popen[bytes]] = []

    def send_all(self, letters: list[tuple[Job, str]], host: str) -> None:
        """Mail each (job, letter), as many as fit beside the sendmails still
        running; the rest are dropped with one warning. Built only when sent:
        a qdel of a 20,000-task array that asked for abort mail would build
        20,000 messages (~0.4 ms each) in the server's loop."""
        self._children = [c for c in self._children if c.poll() is None]
        if self.path is None or not letters:
            return
        room = max(0, _MAX_PENDING - len(self._children))
        for job, letter in letters[:room]:
            self._send(message(job, letter, host))
        if len(letters) > room:
            log.warning(
                "%d mail(s) dropped (%d sendmails pending), the first for job %s",
                len(letters) - room,
                _MAX_PENDING,
                letters[room][0].display_id,
            )

    def _send(self, msg: EmailMessage) -> None:
        assert self.path is not None
        try:
            child = subprocess.Popen(
                [self.path, "-t", "-oi"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            assert child.stdin is not None
            child.stdin.write(msg.as_bytes())
            child.stdin.close()
        except OSError as exc:
            log.warning("cannot run %s: %s", self.path, exc)
            return
        self._children.append(child)
