"""Configuration and the places a cluster keeps its files.

Everything lives under one home directory, ``$MB_HOME`` (default ``~/.minibatch``):
``minibatch.toml`` (the config), ``run/`` (sockets, pid files, the broker URL),
``state/`` (the SQLite database), ``spool/`` (job scripts while jobs run) and
``log/`` (one log per daemon). Clusters in different homes share nothing, not
even a TCP port.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from minibatch.core import usage
from minibatch.core.units import parse_duration
from minibatch.errors import InvalidArgument
from minibatch.homedir import CONFIG_NAME, default_endpoint, env_server, home_dir


# A Struct, not a dataclass: importing dataclasses brings in inspect (~6 ms of
# every command's start).
class Paths(msgspec.Struct, frozen=True):
    home: Path

    @classmethod
    def from_env(cls) -> Paths:
        return cls(Path(home_dir()))

    @property
    def config(self) -> Path:
        return self.home / CONFIG_NAME

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def state(self) -> Path:
        return self.home / "state"

    @property
    def log(self) -> Path:
        return self.home / "log"

    @property
    def spool(self) -> Path:
        return self.home / "spool"

    @property
    def database(self) -> Path:
        return self.state / "minibatch.db"

    @property
    def keys(self) -> Path:
        """This host's CURVE keys as a client of a server on another host (a
        user's commands, a node daemon): its keypair and the server's public
        key (``mb keys init --client``, ``mb keys trust``)."""
        return self.home / "keys"

    @property
    def server_keys(self) -> Path:
        """The server's CURVE keypair and the client keys it accepts over tcp
        (``mb keys init``, ``mb keys add-user``); in ``state/``, the owner's."""
        return self.state / "keys"

    @property
    def mqtt_url_file(self) -> Path:
        return self.run / "mqtt.url"

    @property
    def mqtt_credentials(self) -> Path:
        """``user:password`` the server publishes with (mode 0600)."""
        return self.run / "mqtt.credentials"

    def pidfile(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    def logfile(self, daemon: str) -> Path:
        return self.log / f"{daemon}.log"

    def make(self) -> None:
        """Create the directories, and give them (an existing cluster's too)
        the modes that keep the state private and the rest usable by all.

        ``run/`` must be reachable by every local user (the socket: identity
        comes from peer credentials), and ``spool/`` traversable, not listable:
        a job's script and ``$TMPDIR`` there are its user's alone (0700), but
        its user must reach them. ``state/`` (the database: every job's
        environment and script) is the owner's alone, and so are the database
        files, created here so SQLite gives its WAL files the same mode.
        """
        modes = {self.run: 0o755, self.state: 0o700, self.spool: 0o711}
        for d in (self.home, self.run, self.state, self.spool, self.log):
            d.mkdir(parents=True, exist_ok=True)
        if self.home.stat().st_uid != os.geteuid():
            return  # not ours to change (a user's command on another's home)
        # The home must be traversable for run/ and spool/; its other bits
        # are whoever made it's choice.
        self.home.chmod(self.home.stat().st_mode & 0o7777 | 0o111)
        for d, mode in modes.items():
            d.chmod(mode)
        fd = os.open(self.database, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.database}{suffix}").chmod(0o600)


class NodeConfig(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cpus: list[int]
    mem: str | None = None


class ServerConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True
):
    endpoint: str = ""
    #: tcp endpoints (``tcp://0.0.0.0:5555``) the server also listens on, for
    #: commands and node daemons on other hosts: always CURVE, and only keys
    #: registered with ``mb keys add-user``/``add-node`` get in.
    listen: list[str] = []
    #: A node that sends no heartbeat for this long is marked down.
    node_timeout: float = 10.0
    #: Users, besides root and the cluster's owner, who may run operator commands.
    operators: list[str] = []
    #: "normal" survives a crash of the server process; "full" also a power cut.
    sqlite_synchronous: str = "normal"
    #: The sendmail job mail goes through ("" = /usr/sbin/sendmail if present).
    sendmail: str = ""
    #: libzmq drops a larger message and the connection that sent it, before
    #: reading it whole: room for the largest script and environment below.
    max_message_bytes: Annotated[int, msgspec.Meta(ge=1)] = 64 << 20
    #: The largest job script, and environment (names, values and ``=``), a
    #: submission may carry; every array task keeps a copy of both.
    max_script_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1 << 20
    max_env_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1 << 20
    #: Connections one user may hold open to the server at once (root and the
    #: cluster's owner: no limit but the open file limit).
    max_connections_per_user: Annotated[int, msgspec.Meta(ge=1)] = 256


class ClientConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True
):
    #: The server this host's commands and node daemons reach: "" = this
    #: MB_HOME's own (its ipc socket), or another host's ``tcp://host:5555``.
    #: ``$MB_SERVER`` overrides it.
    server: str = ""


class SchedulerConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True
):
    policy: str = "easy"
    params: dict[str, Any] = {}
    #: Policy names -> ``module:callable``, for policies not installed as entry
    #: points. Only this file names code the daemons import: ``mb policy set``
    #: picks among names (see :mod:`minibatch.policy.registry`).
    policy_modules: dict[str, str] = {}
    #: Seconds between periodic passes (the safety net behind event-driven passes).
    interval: float = 10.0
    #: Passes start at least this far apart; events in between fold into one pass.
    coalesce_ms: float = 2.0
    #: The same while every CPU is allocated: no pass could start anything then
    #: (the server itself starts the plan's upcoming jobs as CPUs free), so
    #: passes only refresh reasons and the upcoming list, and may wait longer.
    full_coalesce_ms: float = 25.0


class NodeDaemonConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True
):
    heartbeat: float = 1.0
    #: Seconds between SIGTERM and SIGKILL when a job is killed (walltime, qdel).
    kill_grace: float = 5.0
    #: Seconds between samples of a job's process tree (memory limit, max RSS).
    sample_interval: float = 0.25
    #: Sent to a malleable job's processes that catch it once its CPUs changed
    #: (``USR1``, ``USR2``, ... or ``none``).
    resize_signal: str = "USR1"
    #: Put each job in cgroups of its own (hard CPU, memory and task limits)
    #: where the daemon may create them; false: affinity and sampling only.
    cgroups: bool = True
    #: Tasks (processes and threads) one job may have at once; 0: no limit.
    pids_max: int = 4096


class QosConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A quality of service (``[[qos]]``): ``qsub -l qos=NAME`` picks one."""

    name: str
    #: Added to the priority of its jobs by the priority policies (Maui QOS PRIORITY).
    priority: float = 0.0
    #: The longest walltime a job of this QOS may ask for (seconds or HH:MM:SS).
    max_walltime: int | str | None = None
    #: Running jobs one user may have in this QOS at once (Maui MAXJOB).
    max_jobs_per_user: int | None = None

    def walltime_limit(self) -> int | None:
        if self.max_walltime is None:
            return None
        if isinstance(self.max_walltime, int):
            return self.max_walltime
        return parse_duration(self.max_walltime)


class QueueConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A queue (``[[queue]]``; Maui's class, Slurm's partition): ``qsub -q NAME``."""

    name: str
    #: Orders its jobs ahead of lower queues' (PBS queue priority, Maui class
    #: priority); within a queue, ``qsub -p`` and then submission order.
    priority: float = 0.0
    #: The walltime of its jobs that ask for none (seconds or HH:MM:SS).
    default_walltime: int | str | None = None
    #: The longest walltime and the most CPUs one job may ask for.
    max_walltime: int | str | None = None
    max_cpus: int | None = None
    #: Who may submit to it (PBS acl_users); empty: everyone.
    users: list[str] = []
    #: False: it accepts no new jobs (PBS ``enabled``, qdisable).
    enabled: bool = True
    #: False: its jobs stay queued and none starts (PBS ``started``, qstop).
    started: bool = True

    def seconds(self, value: int | str | None) -> int | None:
        if value is None or isinstance(value, int):
            return value
        return parse_duration(value)


class FairshareConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Maui's fairshare usage windows (FSINTERVAL, FSDEPTH, FSDECAY, FSPOLICY).

    Defaults are Maui's *code* defaults (``include/msched.h``): 12 h windows, 8 of
    them, no decay; usage counted in dedicated CPU-seconds.
    """

    #: Length of one usage window, seconds or HH:MM:SS (FSINTERVAL).
    interval: float | str = 43200.0
    #: Number of windows kept (FSDEPTH, at most 24).
    depth: int = 8
    #: Weight of each older window relative to the next newer one (FSDECAY).
    decay: float = 1.0
    #: What usage counts (FSPOLICY): dedicatedps, dedicatedpes or none.
    policy: str = "dedicatedps"
    #: Seconds between recomputations while nothing ends (running jobs accrue).
    refresh: float = 60.0

    def usage_config(self) -> usage.FairshareConfig:
        """As :mod:`minibatch.core.usage` takes it; ValueError names a bad value."""
        interval = self.interval
        seconds = (
            float(parse_duration(interval))
            if isinstance(interval, str)
            else float(interval)
        )
        try:
            policy = usage.FsPolicy(self.policy.upper())
        except ValueError:
            names = ", ".join(p.value.lower() for p in usage.FsPolicy)
            raise ValueError(
                f"policy must be one of {names}, not {self.policy!r}"
            ) from None
        return usage.FairshareConfig(
            policy=policy, interval=seconds, depth=self.depth, decay=self.decay
        )


class MqttConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: Empty: ``mb up`` starts a broker on a free loopback port.
    url: str = ""
    #: The broker ``mb up`` starts: Debian's mosquitto (a C broker, a third of
    #: the embedded one's CPU per event), the embedded amqtt, or "auto":
    #: mosquitto when it is installed. Either way only the server may publish
    #: (``run/mqtt.credentials``).
    broker: Literal["auto", "amqtt", "mosquitto"] = "auto"
    topic_prefix: str = "minibatch/v1"


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    cluster_name: str = "minibatch"
    oversubscribe: bool = False
    server: ServerConfig = ServerConfig()
    client: ClientConfig = ClientConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    node: NodeDaemonConfig = NodeDaemonConfig()
    mqtt: MqttConfig = MqttConfig()
    fairshare: FairshareConfig = FairshareConfig()
    #: The QOS of jobs submitted without ``-l qos=`` ("" = none: no limits).
    default_qos: str = ""
    qos: list[QosConfig] = []
    nodes: list[NodeConfig] = []
    #: Queues; without any there is one, ``batch``, open to all, without limits.
    queue: list[QueueConfig] = []
    #: Where jobs go that name no queue.
    default_queue: str = "batch"
    #: Refuse, rather than note and carry on, a job naming a queue or a node
    #: feature this cluster does not have.
    strict: bool = False
    #: Node properties (Torque's nodes file, Slurm's Features) by node name,
    #: matched by ``nodes=N:PROPERTY`` and ``-C``/``--constraint``.
    features: dict[str, list[str]] = {}
    #: GPUs by node name (``nodes=1:gpus=2``, ``--gres=gpu:2``).
    gpus: dict[str, int] = {}

    def check(self) -> None:
        """Refuse values that parse but make no sense, naming the key."""
        names = [q.name for q in self.qos]
        for q in self.qos:
            if not q.name or names.count(q.name) > 1:
                raise InvalidArgument(f"[[qos]] names must be unique: {q.name!r}")
            limit = q.walltime_limit()
            if limit is not None and limit <= 0:
                raise InvalidArgument(f"qos {q.name!r}: max_walltime must be positive")
            if q.max_jobs_per_user is not None and q.max_jobs_per_user < 1:
                raise InvalidArgument(
                    f"qos {q.name!r}: max_jobs_per_user must be at least 1"
                )
        self._check_queues()
        self._check_policy()
        self._check_endpoints()
        if any(n < 0 for n in self.gpus.values()):
            raise InvalidArgument("[gpus]: counts must not be negative")
        if self.default_qos and self.default_qos not in names:
            raise InvalidArgument(
                f"default_qos {self.default_qos!r} is not a [[qos]] entry"
            )
        try:
            self.fairshare.usage_config()
        except ValueError as exc:
            raise InvalidArgument(f"[fairshare]: {exc}") from None
        from minibatch.malleable import signal_named

        try:
            signal_named(self.node.resize_signal)
        except ValueError as exc:
            raise InvalidArgument(f"[node] resize_signal: {exc}") from None

    def _check_policy(self) -> None:
        for name, target in self.scheduler.policy_modules.items():
            if not name or ":" in name or target.count(":") != 1:
                raise InvalidArgument(
                    f"[scheduler.policy_modules] {name} = {target!r}: expected "
                    'NAME = "module:callable"'
                )

    def _check_endpoints(self) -> None:
        # Plain tcp would carry no identity and no encryption: tcp is only
        # ever CURVE, configured apart from the ipc endpoint.
        if self.server.endpoint and not self.server.endpoint.startswith("ipc://"):
            raise InvalidArgument(
                f"[server] endpoint {self.server.endpoint!r} must be ipc://...: "
                "tcp endpoints go in [server] listen (always with CURVE keys)"
            )
        for endpoint in self.server.listen:
            if not endpoint.startswith("tcp://"):
                raise InvalidArgument(
                    f"[server] listen: {endpoint!r} is not a tcp:// endpoint"
                )
        if self.client.server and not self.client.server.startswith(
            ("tcp://", "ipc://")
        ):
            raise InvalidArgument(
                f"[client] server {self.client.server!r}: expected tcp://HOST:PORT"
            )

    def _check_queues(self) -> None:
        names = [q.name for q in self.queue]
        for q in self.queue:
            if not q.name or names.count(q.name) > 1:
                raise InvalidArgument(f"[[queue]] names must be unique: {q.name!r}")
            try:
                for value in (q.default_walltime, q.max_walltime):
                    q.seconds(value)
            except InvalidArgument as exc:
                raise InvalidArgument(f"queue {q.name!r}: {exc}") from None
            if q.max_cpus is not None and q.max_cpus < 1:
                raise InvalidArgument(f"queue {q.name!r}: max_cpus must be at least 1")
        if names and self.default_queue not in names:
            raise InvalidArgument(
                f"default_queue {self.default_queue!r} is not a [[queue]] entry"
            )

    def server_endpoint(self, paths: Paths) -> str:
        """The ipc socket the server binds, which the daemons beside it use."""
        return self.server.endpoint or default_endpoint(str(paths.home))

    def client_endpoint(self, paths: Paths) -> str:
        """Where this host's commands reach the server: ``$MB_SERVER``, else
        ``[client] server`` (another host's ``tcp://``), else the local socket."""
        return env_server() or self.client.server or self.server_endpoint(paths)

    def node_named(self, name: str) -> NodeConfig:
        for node in self.nodes:
            if node.name == name:
                return node
        raise InvalidArgument(f"no node named {name!r} in the configuration")


def load(paths: Paths) -> Config:
    """The config in ``paths.config``, or the defaults when there is none."""
    try:
        text = paths.config.read_bytes()
    except FileNotFoundError:
        return Config()
    except OSError as exc:  # MB_HOME out of this user's reach, say
        raise InvalidArgument(f"{paths.config}: {exc.strerror or exc}") from None
    try:
        config = msgspec.toml.decode(text, type=Config)
        config.check()
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{paths.config}: not UTF-8 text: {exc}") from exc
    # ValueError: int() of a number of 4,301 digits or more, in TOML or a time.
    except (
        msgspec.DecodeError,
        msgspec.ValidationError,
        InvalidArgument,
        ValueError,
    ) as exc:
        raise InvalidArgument(f"{paths.config}: {exc}") from exc
    return config


def mqtt_url(paths: Paths, config: Config) -> str:
    """The broker URL: configured, else the embedded broker's, else empty."""
    if config.mqtt.url:
        return config.mqtt.url
    try:
        return paths.mqtt_url_file.read_text().strip()
    except FileNotFoundError:
        return ""
