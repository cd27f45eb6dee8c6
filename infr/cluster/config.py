"""`infr cluster`'s knobs, in one object: the models, their replicas and resources, the engine
settings each replica passes to infr's own Service, and the ingress's routing and fault limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from infr.errors import InfrError
from infr.serve.service import Config as ServeConfig
from infr.serve.service import served_id


@dataclass(frozen=True)
class ModelEntry:
    ref: str  # MODEL as `infr serve` reads it: path, offline name, Hugging Face ref
    id: str  # the id clients send and see (served_id: the alias, a path's stem, or the ref)


def parse_model(text: str) -> ModelEntry:
    """`REF` or `ALIAS=REF`: the same file may be served under several ids."""
    alias, sep, ref = text.partition("=")
    if not sep:
        alias, ref = "", text
    if not ref or (sep and not alias):
        raise InfrError(f"bad model {text!r}: give MODEL or ALIAS=MODEL")
    return ModelEntry(ref=ref, id=served_id(ref, alias or None))


def parse_replicas(text: str) -> tuple[int, int | None]:
    """`N` (fixed) or `MIN:MAX` (autoscaling bounds)."""
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), (int(hi) if sep else None)
    except ValueError:
        raise InfrError(f"--replicas takes N or MIN:MAX, got {text!r}") from None
    if a < (0 if sep else 1) or (b is not None and (b < 1 or b < a)):
        raise InfrError(f"--replicas {text!r}: need N >= 1, or 0 <= MIN <= MAX with MAX >= 1")
    return a, b


@dataclass
class ClusterConfig:
    models: list[ModelEntry] = field(default_factory=list)
    replicas: int = 1  # per model; the lower bound when max_replicas is set
    max_replicas: int | None = None  # autoscaling upper bound (None: a fixed number of replicas)
    num_cpus: float = 1.0  # Ray resources of each engine replica
    num_gpus: float = 0.0
    # each replica's engine, as `infr serve` takes it
    ctx: int = 4096
    parallel: int = 4
    batch_tokens: int = 512
    kv_size: object = None
    backend: str = "auto"
    # the Ray cluster and the HTTP side
    address: str | None = None  # an existing cluster (ray://, host:port or "auto"); None starts a local one
    local_cpus: int | None = None  # logical CPUs of a local cluster (default: enough for every replica)
    local_gpus: int | None = None  # GPUs a local cluster advertises (default: app.local_gpus)
    object_store_mb: int = 200  # a local cluster's object store: requests and tokens are small
    replica_logs: bool = True  # the replicas' and the ingress's log lines on this console too
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    app_name: str = "infr"
    # routing and faults
    affinity_blocks: int = 32  # prompt blocks hashed for prefix-aware routing (32 x 32 tokens)
    affinity_entries: int = 100_000  # block hashes remembered (LRU)
    affinity_slack: int = 2  # a prefix keeps its replica while that has at most this many requests more than the idlest
    first_event_s: float = 600.0  # a replica silent this long (queued prompt included) fails the request
    event_gap_s: float = 60.0  # the longest silence between two events of one answer
    probe_s: float = 1.0  # how often a failed replica is asked whether it is back
    drain_s: float = 20.0  # shutdown waits this long for requests in flight
    max_ongoing: int = 256  # requests a replica holds at once (its own scheduler queues beyond --parallel)
    # autoscaling (--replicas MIN:MAX): Ray Serve's defaults; the tests shorten them
    upscale_delay_s: float = 30.0  # load above the target this long adds replicas
    downscale_delay_s: float = 600.0  # load below it this long removes them
    look_back_s: float = 30.0  # the window the load is averaged over

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    def serve_config(self, model: ModelEntry) -> ServeConfig:
        """What one replica's infr Service runs: the served id as its alias, any name accepted
        (the ingress routes strictly before a request gets there)."""
        return ServeConfig(model=model.ref, ctx=self.ctx, parallel=self.parallel, batch_tokens=self.batch_tokens,
                           kv_size=self.kv_size, backend=self.backend, model_alias=model.id, strict_model=False)

    def check(self) -> None:
        if not self.models:
            raise InfrError("infr cluster needs at least one model")
        ids = [m.id for m in self.models]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise InfrError(f"two models are served as {sorted(dup)[0]!r}: give one an alias (ALIAS=MODEL)")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise InfrError("--num-cpus and --num-gpus must be >= 0")
        if self.parallel < 1 or self.batch_tokens < self.parallel:
            raise InfrError("--parallel must be >= 1 and --batch-tokens at least --parallel")
