"""The planning core compiled to C with mypyc, used only while it matches its source.

A conservative pass asks hundreds of thousands of small questions of the
nodes' timelines (:mod:`minibatch.policy.timeline`, :mod:`~minibatch.policy.search`);
in the interpreter each costs more in calls and boxed numbers than in the
question. mypyc (part of mypy) compiles those typed modules unchanged into C
extensions: the same code, the same decisions, about twice as fast
(docs/benchmarks.md, "Scheduler pass"). The Python source stays the one truth:

* ``python -m minibatch.native`` (``make``) compiles :data:`MODULES` into
  ``minibatch/policy/_native/`` with a digest of their source;
* :func:`attach` (run by ``minibatch/policy/__init__.py``) puts that directory
  first on the package's path only while the digest matches the source on disk
  and this interpreter, so an edited module is never shadowed by the build of
  its old text: until the next ``make``, the package runs as plain Python.
  ``MB_PURE_PYTHON=1`` runs it as plain Python regardless.

Without a C compiler or mypy the build says why and the package stays pure
Python: slower, never different.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator

#: The modules compiled together (one mypyc group: calls between them are C
#: calls), relative to the package's parent directory.
MODULES = (
    "minibatch/policy/timeline.py",
    "minibatch/policy/search.py",
    "minibatch/policy/profile.py",
    "minibatch/policy/book.py",
    "minibatch/policy/planning.py",
)
#: Where the build goes, inside ``minibatch/policy``.
DIRNAME = "_native"
#: The group's shared library is ``minibatch/policy/native__mypyc*.so``.
GROUP = "minibatch.policy.native"
STAMP = "SOURCES"

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def digest(root: str = _ROOT) -> str:
    """What a build depends on: the modules' text, this interpreter's ABI."""
    h = hashlib.blake2b(digest_size=16)
    h.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    for rel in MODULES:
        with open(os.path.join(root, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def fresh(root: str = _ROOT) -> bool:
    """Whether the build in ``root`` was made from the modules as they are."""
    try:
        with open(os.path.join(root, "minibatch", "policy", DIRNAME, STAMP)) as f:
            stamp = f.read().strip()
    except OSError:
        return False
    try:
        return stamp == digest(root)
    except OSError:
        return False


def attach(path: list[str]) -> bool:
    """Put a fresh build first on ``path`` (``minibatch.policy.__path__``)."""
    if os.environ.get("MB_PURE_PYTHON") or not fresh():
        return False
    path.insert(0, os.path.join(_ROOT, "minibatch", "policy", DIRNAME))
    return True


def compiled() -> bool:
    """Whether this process plans with the compiled modules."""
    from minibatch.policy import timeline

    return not timeline.__file__.endswith(".py") if timeline.__file__ else False


def build(root: str = _ROOT) -> str:
    """Compile :data:`MODULES` into ``minibatch/policy/_native``; what was done.

    Raises RuntimeError (the reason) when it cannot: no mypy, no C compiler.
    """
    dest = os.path.join(root, "minibatch", "policy", DIRNAME)
    if fresh(root):
        return f"up to date ({dest})"
    stamp = digest(root)
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution
    except ImportError as e:
        raise RuntimeError(f"no mypyc ({e.name} is not installed)") from e
    if not shutil.which(str(sysconfig.get_config_var("CC") or "cc").split()[0]):
        raise RuntimeError("no C compiler (install gcc)")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python headers in {include} (install python3-dev)")
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="mb-native-") as tmp:
        log = os.path.join(tmp, "build.log")
        os.chdir(root)  # mypy names modules by their path from here
        try:
            # mypy, setuptools and gcc all talk: into a log, shown on failure.
            with _quiet(log):
                exts = mypycify(
                    list(MODULES), opt_level="3", group_name=GROUP, target_dir=tmp
                )
                dist = Distribution({"ext_modules": exts, "script_name": "native"})
                cmd = dist.get_command_obj("build_ext")
                cmd.build_lib = os.path.join(tmp, "lib")
                cmd.build_temp = os.path.join(tmp, "obj")
                cmd.ensure_finalized()
                cmd.run()
        except (Exception, SystemExit) as e:
            with open(log, errors="replace") as f:
                tail = "".join(f.readlines()[-20:])
            raise RuntimeError(f"mypyc failed: {e}\n{tail}") from e
        finally:
            os.chdir(cwd)
        built = os.path.join(tmp, "lib", "minibatch", "policy")
        # Made aside and renamed into place: a daemon importing meanwhile sees
        # the old build or the new one, never half of one.
        new = tempfile.mkdtemp(prefix=DIRNAME + ".", dir=os.path.dirname(dest))
        for name in sorted(os.listdir(built)):
            shutil.copy2(os.path.join(built, name), new)
        with open(os.path.join(new, STAMP), "w") as f:
            f.write(stamp + "\n")
        os.chmod(new, 0o755)
        old = dest + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(dest):
            os.rename(dest, old)
        os.rename(new, dest)
        shutil.rmtree(old, ignore_errors=True)
    return f"compiled {len(MODULES)} modules into {dest}"


@contextlib.contextmanager
def _quiet(log: str) -> Iterator[None]:
    """Send this process's and its children's output to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def main() -> int:
    try:
        print(f"minibatch.native: {build()}")
    except RuntimeError as e:
        print(f"minibatch.native: staying pure Python: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
