"""The evaluation spread over a Ray cluster (`local_evaluation.py --ray [ADDRESS]`).

One Ray actor per UserModel replica, each asking Ray for the GPUs its config needs; the driver hands the next batch
to whichever actor is free and appends its answers to the run folder's predictions.jsonl through the runner's
PredictionLog, so the folder (resume, manifest, report, compare, rejudge) is that of a local run. The grader's
contract holds per batch: its deadline is measured inside the actor; a batch over it is "i don't know" and its
actor is restarted (a thread cannot be stopped, a process can), as the local run restarts its model process; a
batch whose actor died is retried once on another actor, then answered "i don't know" with the reason in its
trace, which the report counts. The judge runs as a pool of Ray tasks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import socket
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from loguru import logger
from ray.exceptions import RayActorError, RayTaskError
from tqdm import tqdm

from evaluation.judge import judge_records
from evaluation.runner import EvaluationError, PredictionLog, call_with_limit, check_batch_size, checked_answers, take
from evaluation.worker import WorkerError, reply
from models.config import ConfigError, SystemConfig
from models.llm.backend import BackendUnavailable
from utils.answers import IDK
from utils.batch import BatchResult, make_batch

ACTOR_PREFIX = "crag-replica"
LOCAL = "local"  # --ray without an address: a Ray instance of this machine, started for the run
JOINED = "joined"  # a Ray instance this process had joined before the run (ray.init by the caller)
FORWARDED_ENV = ("CRAG_",)  # environment variables an actor on a cluster gets from the driver (a local one has all)
POLL_S = 0.5  # the driver's wait between looks at Ctrl-C and the progress bar


# --- the cluster --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    """The Ray cluster this run uses: its address as given (LOCAL for an instance of this machine), what it has."""

    address: str
    cpus: float
    gpus: float
    nodes: int

    def describe(self) -> str:
        where = {LOCAL: "a local Ray instance", JOINED: "the Ray instance this process joined"}.get(
            self.address, f"the Ray cluster at {self.address}")
        return f"{where} ({self.nodes} node{'s' * (self.nodes != 1)}, {self.cpus:g} CPUs, {self.gpus:g} GPUs)"


def check_address(address: str) -> None:
    """A ConfigError (one line, naming --ray and the fix) when `address` names no Ray head that answers; checked
    before ray.init, which would wait a minute on a wrong host. "auto" (RAY_ADDRESS, else this machine's cluster)
    is left to ray.init, which fails at once."""
    if address in (LOCAL, "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray {address}: give the head's HOST:PORT (`ray start --head` prints it, port 6379 by "
                          "default), ray://HOST:10001 for Ray Client, auto, or no address for a local Ray instance")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as err:
        raise ConfigError(f"--ray {address}: nothing answers there ({err.strerror or err}); start the head with "
                          "`ray start --head` and give the address it prints, or leave the address out for a local "
                          "Ray instance") from None


@contextlib.contextmanager
def connected(address: str, local_cpus: int | None = None) -> Iterator[Cluster]:
    """Ray for the block: the instance this process has already joined, else the cluster at `address`, else (LOCAL)
    a new instance of this machine with `local_cpus` CPUs (None: all). What this call connects, it disconnects."""
    started = not ray.is_initialized()
    if started:
        check_address(address)
        options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
        if address == LOCAL:
            options |= {"num_cpus": local_cpus, "include_dashboard": False}
        else:
            options["address"] = address
        try:
            ray.init(**options)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ConfigError(f"--ray {address}: Ray could not connect ({str(err).splitlines()[0]}); check the "
                              "address, or leave it out for a local Ray instance") from None
    try:
        resources = ray.cluster_resources()
        yield Cluster(address if started else JOINED, resources.get("CPU", 0.0),
                      resources.get("GPU", 0.0), sum(1 for node in ray.nodes() if node.get("Alive")))
    finally:
        if started:
            ray.shutdown()


def replica_gpus(config: SystemConfig) -> float:
    """The GPUs one UserModel of `config` asks Ray for: vLLM's tensor-parallel size, else 1 where any of its models
    is placed on CUDA (the LLM of the active backend, the embedder, the re-ranker, R2AG, ...), else 0."""
    if config.llm.backend == "vllm":
        return float(max(1, config.llm.vllm.tensor_parallel_size))

    def devices(node: Any, path: str) -> Iterator[str]:
        for item in dataclasses.fields(node):
            value = getattr(node, item.name)
            where = f"{path}.{item.name}".lstrip(".")
            if where.startswith("llm.") and not where.startswith(f"llm.{config.llm.backend}"):
                continue  # a backend's section the config does not use
            if dataclasses.is_dataclass(value):
                yield from devices(value, where)
            elif item.name == "device" and isinstance(value, str):
                yield value

    return 1.0 if any(d.startswith("cuda") or d == "auto" for d in devices(config, "")) else 0.0


def replica_config(config: SystemConfig) -> SystemConfig:
    """The config a replica runs: pages processed in the actor's own process (Ray spreads the work; an actor that
    forked a pool of its own would count for one CPU and use many)."""
    return dataclasses.replace(config, references=dataclasses.replace(config.references, workers=1))


def replica_count(cluster: Cluster, gpus: float, asked: int | None) -> int:
    """How many replicas to start: `asked`, else as many as the cluster holds (its GPUs by `gpus` each, else one a
    CPU); a ConfigError when the cluster cannot hold one, or the number asked."""
    fits = int(cluster.gpus // gpus) if gpus else int(cluster.cpus)
    if fits < 1 or (asked is not None and asked > fits):
        need = f"{gpus:g} GPU{'s' * (gpus != 1)} and 1 CPU" if gpus else "1 CPU"
        wanted = f"{asked} replicas" if asked else "one replica"
        raise ConfigError(f"--ray: {cluster.describe()} cannot hold {wanted} of {need} each (the config's "
                          f"num_gpus); add nodes, or ask for fewer with --ray-actors")
    return asked or fits


# --- the replicas -------------------------------------------------------------------------------------------------

def _log_at(level: str) -> None:
    """In a Ray worker: loguru's messages from `level` up, to stderr (Ray shows them at the driver, named)."""
    logger.remove()
    logger.add(sys.stderr, level=level)


class Replica:
    """One UserModel in a Ray actor, built by `factory()`; asked for one batch at a time, its deadline measured here.
    Its replies are ("ok", value) or ("error", one line): the driver raises the error as the local run would."""

    def __init__(self, factory: Callable[[], Any], log_level: str, clock: Callable[[], float]) -> None:
        _log_at(log_level)
        self.clock = clock
        started = time.perf_counter()
        self.model: Any = None  # the user's model
        self.error: str | None = None
        try:
            self.model = factory()
        except Exception as err:  # said by ready(), which the driver raises as one line
            self.error = f"{type(err).__name__}: {err}"
        self.load_seconds = time.perf_counter() - started

    def ready(self) -> tuple[str, Any]:
        """("ok", (batch size, load seconds, node, pid)) once the model is built; ("error", why) where it could not
        be."""
        if self.error is not None:
            return "error", f"the model could not be built: {self.error}"
        return reply(lambda: (self.model.get_batch_size(), self.load_seconds, ray.util.get_node_ip_address(),
                              os.getpid()))

    def answer(self, batch: dict[str, list[Any]], limit_s: float | None) -> tuple[str, Any]:
        """("ok", (result, seconds, timed_out, next batch size)). Past `limit_s` it replies at once with timed_out
        set and no result, leaving the late call running: the driver then restarts this actor."""
        return reply(functools.partial(self._answer, batch, limit_s))

    def _answer(self, batch: dict[str, list[Any]],
                limit_s: float | None) -> tuple[BatchResult | None, float, bool, int | None]:
        result, seconds, timed_out = call_with_limit(self.model, batch, limit_s, wait_late=False, clock=self.clock)
        if timed_out:
            return None, seconds, True, None
        return result, seconds, False, self.model.get_batch_size()


@dataclass
class Job:
    """A batch on its way: its examples, the actors it failed on (an actor that died)."""

    examples: list[dict[str, Any]]
    failed_on: list[str] = field(default_factory=list)


@dataclass
class Actor:
    """A replica's handle, its name, the batch size it asked for last (None until it is ready), and the process it
    runs in (`killed`: the one restart() killed, which may still answer a probe before it dies)."""

    handle: Any
    name: str
    batch_size: int | None = None
    pid: int | None = None
    killed: int | None = None


class ReplicaPool:
    """The replicas of one run, started together and ended together (also on Ctrl-C)."""

    def __init__(self, factory: Callable[[], Any], count: int, gpus: float, log_level: str, forward_env: bool,
                 clock: Callable[[], float]) -> None:
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)} if forward_env else {}
        remote = ray.remote(Replica)
        options = {"num_cpus": 1, "num_gpus": gpus, "max_restarts": -1, "max_task_retries": 0,
                   **({"runtime_env": {"env_vars": env}} if env else {})}
        token = uuid.uuid4().hex[:8]  # names are unique in a Ray namespace: two runs on one cluster do not clash
        names = [f"{ACTOR_PREFIX}-{token}-{i}" for i in range(count)]
        self.actors = [Actor(remote.options(name=name, **options).remote(factory, log_level, clock), name)
                       for name in names]

    def probe(self, actor: Actor) -> Any:
        """A ready() call that waits while Ray restarts the actor, and fails only once it is dead for good."""
        return actor.handle.ready.options(max_task_retries=-1).remote()

    def restart(self, actor: Actor) -> None:
        """Kill the actor's process (its late batch with it); Ray starts it again and builds a fresh model."""
        actor.batch_size, actor.killed = None, actor.pid
        ray.kill(actor.handle, no_restart=False)

    def stop(self) -> None:
        for actor in self.actors:
            ray.kill(actor.handle, no_restart=True)


def run_on_ray(factory: Callable[[], Any], examples: Iterable[dict[str, Any]], predictions_path: Path,
               actors: int, gpus: float, per_query_s: float | None = 30.0,
               count: Callable[[Collection[str]], int] | None = None, log_level: str = "WARNING",
               forward_env: bool = False, clock: Callable[[], float] = time.monotonic) -> list[dict[str, Any]]:
    """run_model's records (every example once, in order; those of an earlier run kept), answered by `actors`
    replicas built by `factory()`, each with `gpus` GPUs and its batches' deadlines by `clock` (called in the
    replica's process). No replica starts when every answer is there."""
    log = PredictionLog(predictions_path)
    queue = log.pending(examples)
    first = next(queue, None)
    if first is None:
        return log.records()
    pool = ReplicaPool(factory, actors, gpus, log_level, forward_env, clock)
    print(f"starting {actors} UserModel replicas on Ray ({gpus:g} GPU{'s' * (gpus != 1)} each)", file=sys.stderr)
    try:
        with log.appending(count=count):
            Dispatcher(pool, log, itertools.chain([first], queue), per_query_s).run()
    finally:  # Ctrl-C and errors too: no replica outlives the run
        pool.stop()
    return log.records()


class Dispatcher:
    """Hands batches to free replicas and records what comes back, until every example is answered."""

    def __init__(self, pool: ReplicaPool, log: PredictionLog, queue: Iterator[dict[str, Any]],
                 per_query_s: float | None) -> None:
        self.pool, self.log, self.queue, self.per_query_s = pool, log, queue, per_query_s
        self.free: deque[Actor] = deque()
        self.retries: deque[Job] = deque()
        self.waiting: dict[Any, tuple[Actor, Job | None]] = {}  # ref -> (actor, job); job None: a ready() probe
        self.alive = {actor.name for actor in pool.actors}
        self.exhausted = False
        self.ready_once = False
        self.earlier = f", {len(log.done)} already in {log.path.name}" if log.done else ""

    def run(self) -> None:
        for actor in self.pool.actors:
            self.waiting[self.pool.probe(actor)] = (actor, None)
        while True:
            self._dispatch()
            if not self.waiting:
                return
            if self.log.bar is not None:
                self.log.bar.set_postfix_str(f"{len(self.alive)} replicas, {self._busy()} busy{self.earlier}",
                                             refresh=False)
            done, _ = ray.wait(list(self.waiting), num_returns=1, timeout=POLL_S)
            for ref in done:
                actor, job = self.waiting.pop(ref)
                if job is None:
                    self._ready(actor, ref)
                else:
                    self._answered(actor, job, ref)

    def _busy(self) -> int:
        return sum(job is not None for _, job in self.waiting.values())

    def _dispatch(self) -> None:
        """Give every free actor a batch: a retry first (on an actor it has not failed on), else the next examples."""
        for _ in range(len(self.free)):
            actor = self.free.popleft()
            job = next((j for j in self.retries if actor.name not in j.failed_on), None)
            if job is not None:
                self.retries.remove(job)
            elif not self.exhausted:
                size = actor.batch_size
                assert size is not None, "a free actor has answered ready() with its batch size"
                batch = take(self.queue, size)
                self.exhausted = len(batch) < size
                job = Job(batch) if batch else None
            if job is None:
                self.free.append(actor)
                continue
            limit = len(job.examples) * self.per_query_s if self.per_query_s else None
            self.waiting[actor.handle.answer.remote(make_batch(job.examples), limit)] = (actor, job)
        if self.retries and not self.waiting and self.free:  # only actors it failed on are left: the last try
            self._give_up(self.retries.popleft(), "no other replica is alive")
            self._dispatch()

    def _ready(self, actor: Actor, ref: Any) -> None:
        try:
            status, value = ray.get(ref)
        except RayActorError as err:  # dead for good (killed, its node gone): its batches go to the others
            self._lost(actor, err)
            return
        if status == "error":
            raise BackendUnavailable(value) if not self.ready_once else WorkerError(value)
        size, load_seconds, node, pid = value
        if pid == actor.killed:  # ray.kill is asynchronous: the killed process answered before it died
            self.waiting[self.pool.probe(actor)] = (actor, None)
            return
        actor.batch_size, actor.pid = check_batch_size(size), pid
        if not self.ready_once:
            tqdm.write(f"UserModel ready in {load_seconds:.1f} s (replica {actor.name} on {node})", file=sys.stderr)
        self.ready_once = True
        self.free.append(actor)

    def _answered(self, actor: Actor, job: Job, ref: Any) -> None:
        try:
            status, value = ray.get(ref)
        except RayActorError as err:  # the batch's actor died under it: retried once on another, then given up
            job.failed_on.append(actor.name)
            reason = f"its Ray actor died ({type(err).__name__})"
            if len(job.failed_on) > 1:
                self._give_up(job, f"{reason} twice")
            else:
                logger.warning("replica {} died under a batch of {}; retrying it on another", actor.name,
                               len(job.examples))
                self.retries.append(job)
            self.waiting[self.pool.probe(actor)] = (actor, None)  # back when Ray restarts it, else gone
            return
        if status == "error":
            raise WorkerError(value)
        result, seconds, timed_out, size = value
        answers = checked_answers(result.answers if result else None, len(job.examples), timed_out)
        self.log.add(job.examples, answers, seconds, timed_out, result.trace if result else [])
        if timed_out:
            logger.warning("batch of {} exceeded its {:.0f} s limit on replica {}: the replica is restarted",
                           len(job.examples), len(job.examples) * (self.per_query_s or 0), actor.name)
            self.pool.restart(actor)
            self.waiting[self.pool.probe(actor)] = (actor, None)
            return
        actor.batch_size = check_batch_size(size)
        self.free.append(actor)

    def _lost(self, actor: Actor, err: Exception) -> None:
        self.alive.discard(actor.name)
        logger.warning("replica {} is gone ({}); {} left", actor.name, type(err).__name__, len(self.alive))
        if not self.alive:
            raise EvaluationError(f"every Ray replica died (the last: {str(err).splitlines()[0]}); the answers so "
                                  "far are saved: run the same command again to resume")

    def _give_up(self, job: Job, reason: str) -> None:
        """Record the job's questions as "i don't know", its reason in each trace (the report counts them)."""
        logger.warning("batch of {} answered \"i don't know\": {}", len(job.examples), reason)
        traces = [{"interaction_id": e["interaction_id"], "reason": f"ray: {reason}"} for e in job.examples]
        self.log.add(job.examples, [IDK] * len(job.examples), 0.0, False, traces)


# --- the judge ----------------------------------------------------------------------------------------------------

def _judge_part(build: Callable[[], Any], records: list[dict[str, Any]],
                log_level: str) -> tuple[list[dict[str, Any]], str]:
    """judge_records over one part of a run's records, with the judge `build()` makes; the records and its name."""
    _log_at(log_level)
    judge = build()
    judge_records(records, judge)
    return records, judge.name if judge is not None else "rules"


def judge_on_ray(records: list[dict[str, Any]], build: Callable[[], Any], tasks: int,
                 log_level: str = "WARNING") -> str:
    """judge_records over `records` (updated in place) in `tasks` Ray tasks of one CPU, each with its own judge
    from `build()` (None: the rules); the judge's name."""
    size = max(1, -(-len(records) // max(1, tasks)))
    remote = ray.remote(num_cpus=1, max_retries=1)(_judge_part)
    parts = {
        remote.remote(build, records[start : start + size], log_level): start for start in range(0, len(records), size)
    }
    name = "rules"
    with tqdm(total=len(records), desc=f"judging ({len(parts)} Ray tasks)", unit="q", disable=None,
              dynamic_ncols=True) as bar:
        while parts:
            done, _ = ray.wait(list(parts), num_returns=1, timeout=POLL_S)
            for ref in done:
                start = parts.pop(ref)
                try:
                    judged, name = ray.get(ref)
                except RayTaskError as err:  # the judge could not be built there: its own error, one line
                    raise (err.cause if isinstance(err.cause, Exception) else err) from None
                records[start:start + len(judged)] = judged
                bar.update(len(judged))
    return name
