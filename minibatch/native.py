"""The planning core compiled to C with mypyc, used only while it matches its source.

A conservative pass asks hundreds of thousands of small questions of the
nodes' timelines (:mod:`minibatch.policy.timeline`, :mod:`~minibatch.policy.search`);
in the interpreter each costs more in calls and boxed numbers than in the
question. mypyc (part of mypy) compiles those typed modules unchanged into C
extensions: the same code, the same decisions, about twice as fast
(docs/benchmarks.md, "Scheduler pass"). The Python source stays the one truth:

* ``python -m minibatch.native`` (``make native``) compiles :data:`MODULES`
  into ``minibatch/policy/_native/`` with a stamp: a digest of every
  first-party module they import (mypyc builds in the types those declare)
  and of this interpreter's ABI, and the size of each library it made;
* :func:`attach` (run by ``minibatch/policy/__init__.py``) puts that directory
  first on the package's path only while the stamp matches what is on disk
  and the libraries load, so an edited module is never shadowed by the build
  of its old text: until the next build, the package runs as plain Python.
  ``MB_PURE_PYTHON=1`` runs it as plain Python regardless.

Without a C compiler or mypy the build says why and the package stays pure
Python: slower, never different. The compiled classes (``Pass``, ``Book``,
``Profile``, ``Timeline``, ``Search``) cannot be subclassed or patched from
plain Python: policies compose them.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import importlib
import json
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


def _policy_dir(root: str) -> str:
    return os.path.join(root, "minibatch", "policy")


def sources(root: str = _ROOT) -> list[str]:
    """:data:`MODULES` and every ``minibatch`` module they import, directly
    or not (package ``__init__`` files too), as paths from ``root``."""
    found: dict[str, None] = {}
    todo = list(MODULES)
    while todo:
        rel = todo.pop()
        if rel in found:
            continue
        found[rel] = None
        with open(os.path.join(root, rel), "rb") as f:
            tree = ast.parse(f.read(), rel)
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] != "minibatch":
                    continue
                for k in range(1, len(parts) + 1):  # each package on the way
                    base = os.path.join(*parts[:k])
                    for cand in (f"{base}.py", os.path.join(base, "__init__.py")):
                        if os.path.exists(os.path.join(root, cand)):
                            todo.append(cand.replace(os.sep, "/"))
    return sorted(found)


def digest(root: str, files: list[str]) -> str:
    """What a build depends on: ``files`` (path, length and text of each) and
    this interpreter's ABI."""
    h = hashlib.blake2b(digest_size=16)
    h.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        h.update(b"%s\0%d\0" % (rel.encode(), len(data)))
        h.update(data)
    return h.hexdigest()


def fresh(root: str = _ROOT) -> bool:
    """Whether the build in ``root`` was made from the sources as they are,
    and its libraries are the ones it made."""
    where = os.path.join(_policy_dir(root), DIRNAME)
    try:
        with open(os.path.join(where, STAMP)) as f:
            stamp = json.load(f)
        if stamp["digest"] != digest(root, stamp["files"]):
            return False
        return all(
            os.path.getsize(os.path.join(where, name)) == size
            for name, size in stamp["libraries"].items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _pure() -> bool:
    return os.environ.get("MB_PURE_PYTHON", "").lower() not in ("", "0", "no", "false")


#: How this process plans, and why (set by :func:`attach`).
_state = "plain Python"
_REBUILD = "python -P -m minibatch.native"


def attach(path: list[str]) -> bool:
    """Put a fresh build first on ``path`` (``minibatch.policy.__path__``)."""
    global _state
    where = os.path.join(_policy_dir(_ROOT), DIRNAME)
    if _pure():
        _state = "plain Python (MB_PURE_PYTHON is set)"
        return False
    if not fresh():
        built = os.path.exists(os.path.join(where, STAMP))
        why = "its build is out of date" if built else "not compiled"
        _state = f"plain Python: {why} ({_REBUILD})"
        return False
    path.insert(0, where)
    try:
        # Loaded now, so that a library that cannot load (another libc, a
        # broken copy) leaves the package pure instead of failing later.
        importlib.import_module(f"{GROUP}__mypyc")
    except (ImportError, OSError) as exc:
        path.remove(where)
        _state = f"plain Python: its build does not load ({exc}; {_REBUILD})"
        return False
    _state = "compiled (mypyc)"
    return True


def compiled() -> bool:
    """Whether this process plans with the compiled modules."""
    from minibatch.policy import timeline

    return not timeline.__file__.endswith(".py") if timeline.__file__ else False


def describe() -> str:
    """How this process plans: compiled, or plain Python and why."""
    import minibatch.policy  # noqa: F401  (runs attach)

    return _state


def build(root: str = _ROOT) -> str:
    """Compile :data:`MODULES` into ``minibatch/policy/_native``; what was done.

    Raises RuntimeError (the reason) when it cannot: no mypy, no C compiler,
    no Python headers, a directory it may not write.
    """
    policy = _policy_dir(root)
    dest = os.path.join(policy, DIRNAME)
    if fresh(root):
        return f"up to date ({dest})"
    if not os.access(policy, os.W_OK):
        raise RuntimeError(f"cannot write {policy} (run as the owner of the install)")
    try:
        import mypyc.build  # noqa: F401
        import setuptools  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"no mypyc ({e.name} is not installed)") from e
    cc = os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc")
    if not shutil.which(cc.split()[0]):
        raise RuntimeError(f"no C compiler ({cc.split()[0]}: install gcc)")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python headers in {include} (install python3-dev)")
    with open(os.path.join(policy, DIRNAME + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time
        if fresh(root):
            return f"up to date ({dest})"
        files = sources(root)
        stamp = digest(root, files)
        with tempfile.TemporaryDirectory(prefix="mb-native-") as tmp:
            built = _compile(root, tmp)
            if digest(root, files) != stamp:
                raise RuntimeError("the sources changed during the build: run it again")
            _install(dest, built, {"digest": stamp, "files": files})
    return f"compiled {len(MODULES)} modules into {dest}"


def _compile(root: str, tmp: str) -> str:
    """Run mypyc and the C compiler in ``tmp``; where the libraries are."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    # mypy reads no configuration but this one: a user's (a plugin is code)
    # must not run in a build made as root, nor leave a cache in the install.
    config = os.path.join(tmp, "mypy.ini")
    with open(config, "w") as f:
        f.write("[mypy]\n")
    options = ["--config-file", config, "--cache-dir", os.path.join(tmp, "cache")]
    log = os.path.join(tmp, "build.log")
    cwd = os.getcwd()
    os.chdir(root)  # mypy names modules by their path from here
    try:
        # mypy, setuptools and gcc all talk: into a log, shown on failure.
        with _quiet(log):
            exts = mypycify(
                [*options, *MODULES], opt_level="3", group_name=GROUP, target_dir=tmp
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
    return os.path.join(tmp, "lib", "minibatch", "policy")


def _install(dest: str, built: str, stamp: dict[str, object]) -> None:
    """Move the libraries in ``built`` to ``dest`` with their stamp: made
    aside and renamed into place, so a daemon importing meanwhile sees the
    old build or the new one, never half of one."""
    new = tempfile.mkdtemp(prefix=DIRNAME + ".", dir=os.path.dirname(dest))
    try:
        libraries = {}
        for name in sorted(os.listdir(built)):
            shutil.copyfile(os.path.join(built, name), os.path.join(new, name))
            os.chmod(os.path.join(new, name), 0o755)
            libraries[name] = os.path.getsize(os.path.join(new, name))
        with open(os.path.join(new, STAMP), "w") as f:
            json.dump({**stamp, "libraries": libraries}, f, indent=1)
        os.chmod(os.path.join(new, STAMP), 0o644)
        os.chmod(new, 0o755)
        old = dest + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(dest):
            os.rename(dest, old)
        os.rename(new, dest)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise


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
        done = build()
        if _pure():
            done += "; not used while MB_PURE_PYTHON is set"
        print(f"minibatch.native: {done}")
    except (RuntimeError, OSError) as e:
        print(f"minibatch.native: staying pure Python: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
