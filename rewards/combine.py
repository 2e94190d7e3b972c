"""Combining named rewards into the one scalar per response that the trainer's advantages use.

A reward is TRL's reward function: `fn(prompts, completions, **kwargs) -> list[float | None]` (TRL
`GRPOTrainer` reward functions): one value per completion, `None` meaning "does not apply to this sample"; completions are
strings (or chat messages) for text models and PIL images for image models; the dataset's other columns arrive as
keyword arguments (in training also `completion_ids` and `trainer_state`, `mmrl.training.reward_inputs`). mmrl also accepts
a dict per sample with a `"score"` key: the score is the reward, the other keys are logged. A plain TRL reward
function works unchanged; functions without `**kwargs` receive only the arguments they name. A reward may be given
by import path (`my_pkg.rewards.fn`, `path/to/file.py:fn`; `mmrl.rewards.imports`). `async def` rewards run
concurrently, all on one event loop (`asyncio.gather`, as TRL), each within `timeout`; then the synchronous ones run.

`RewardSet` looks rewards up by name in `REWARDS` (or takes callables), builds configurable ones once (registered
classes are instantiated with their config and load heavy models lazily, once), and returns the weighted sum
`total_i = sum_k w_k r_k,i` over the rewards that apply to sample i, per-reward values, metrics
`rewards/<name>/mean` and `rewards/<name>/std` (TRL's names) and per-sample logged extras.

A reward that raises or returns NaN/inf, a wrong length or a wrong type is an error naming the reward and the sample
index, never a silent 0: `on_error="raise"` raises `RewardError`; `on_error="drop"` marks the sample invalid in
`RewardOutput.valid` (the trainer drops it or its group) and carries on. When a reward raises on the batch it is
re-run one sample at a time to find the failing samples. A wrong-length or non-list return cannot be pinned on a
sample and raises under either setting. A sample to which no reward applies (every reward returned None: TRL's
Example 4 rows, `trl.rewards.accuracy_reward` on an unparseable gold answer) is not an error, as in TRL
(`GRPOTrainer._calculate_rewards`): a warning names its prompt and columns, `RewardOutput.scorable` is False for it,
and the trainer leaves it out of its group's mean and std and gives it advantage 0.

Slow and flaky rewards (reward models served elsewhere, `mmrl.rewards.http`): `timeout` bounds every call of a reward
(a call that does not return in time raises `RewardTimeout`); `retries` re-runs a call that raised or timed out, at
most that many times, after `retry_backoff * 2**k` seconds (capped at `MAX_BACKOFF`). A reward that still cannot score
the batch (`RewardUnavailable`, e.g. a timeout or an unreachable server) fails every sample of the batch: under
"raise" one error naming the reward and the samples, under "drop" every sample is dropped; it is not re-run sample by
sample. With a timeout, a call that runs out of time is stopped and its result is never used
(`mmrl.rewards.isolation`): synchronous rewards run in a warm worker process (forked once, killed at the deadline,
forked again for the next call; rewards stuck in native code stop too) unless marked `in_process` (GPU models,
sockets: `clip_score`, `geneval`, `http`), which run in a worker thread interrupted at the deadline; async rewards
run on an event loop in a thread of their own, so a coroutine that blocks or swallows its cancellation cannot hold
the trainer. A reward in the worker process shares no memory with the trainer. The HTTP reward bounds its whole
request by its own `timeout`. Every wait wakes at least every `POLL_SECONDS`, so a stop request of the trainer
(`RewardsInterrupted`, raised from its signal handler, `mmrl.training.stop_signals`) kills the worker and ends the
wait within that time.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import torch

from mmrl.core.registry import REWARDS
from mmrl.rewards.isolation import (DEFAULT_MEMORY_LIMIT, AsyncRunner, ChildFailed, ChildTimeout, NotPicklable, WarmWorker,
                                    join_by, runs_in_process, stop_thread)
from mmrl.rewards.imports import import_reward, is_import_path, reward_name
from mmrl.rewards.reward_model import SequenceClassifierReward, is_reward_model, is_reward_model_dir

logger = logging.getLogger(__name__)


class RewardError(ValueError):
    """A reward failed or returned something unusable; the message names the reward and the sample index."""


class RewardUnavailable(RewardError):
    """The reward could not score the batch at all (it timed out, or its server stayed unreachable through the
    retries): every sample of the batch fails, and it is not re-run one sample at a time."""


class RewardTimeout(RewardUnavailable):
    """A reward call did not return within `RewardSet(timeout=...)` seconds."""


class _Abandoned(BaseException):
    """Raised inside a timed-out reward thread to stop it (a BaseException: reward code's `except Exception` cannot
    swallow it)."""


MAX_FAILURES_KEPT = 3
"""Failure messages a `RewardOutput` carries (the drop-mode stop message quotes them)."""

MAX_BACKOFF = 60.0
"""Longest wait between two retries of a reward call, in seconds."""

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
"""Rewards are float32 tensors in the trainer: larger values would silently become inf."""


class RewardOutput(NamedTuple):
    total: torch.Tensor
    """[N] float32: weighted sum of the applicable rewards; 0 where `valid` is False."""
    per_reward: dict[str, torch.Tensor]
    """name -> [N] float32 value of each reward, NaN where it does not apply (None) or the sample was dropped."""
    metrics: dict[str, float]
    """`rewards/<name>/mean`, `rewards/<name>/std` (over applicable valid samples), `rewards/<name>/<key>/mean` of
    numeric logged extras, metrics sent through TRL's `log_metric`, and `rewards/dropped` under on_error="drop"."""
    extras: dict[str, list]
    """`<name>/<key>` -> per-sample values of the non-score keys of dict returns (None where absent), plus columns
    sent through TRL's `log_extra`."""
    valid: torch.Tensor
    """[N] bool: False for samples dropped under on_error="drop" (always all True under "raise")."""
    failures: tuple[str, ...] = ()
    """Under on_error="drop": the first few failure messages of this call (reward name, sample, error), for reports."""
    scorable: torch.Tensor | None = None
    """[N] bool: False where every reward returned None (TRL: an unscorable completion, advantage 0; its `total`
    is 0 and is not averaged into the reward metrics). None means all True."""


@dataclass
class _Reward:
    name: str
    fn: Callable
    weight: float
    params: set[str] | None = field(default=None)  # None: accepts **kwargs
    is_async: bool = False  # an `async def` reward: run concurrently with the other async rewards (TRL)


def _accepted_params(fn: Callable) -> set[str] | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return {n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


TRAINER_ARGUMENTS = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra"})
"""The keyword arguments the trainer passes every reward besides the dataset columns (`mmrl.training.reward_inputs`)."""


def _required_params(fn: Callable) -> list[str]:
    """Named parameters of `fn` without a default (positional-or-keyword or keyword-only)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [n for n, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is inspect.Parameter.empty]


def _name_of(fn: Callable) -> str:
    if is_reward_model(fn):
        from mmrl.rewards.reward_model import model_reward_name

        return model_reward_name(fn)  # TRL's name of a reward model
    return getattr(fn, "__name__", None) or getattr(fn, "name", None) or type(fn).__name__


def build_reward(name: str, **config: Any) -> Callable:
    """The reward registered as `name`, configured: a registered class is instantiated with `config` (its heavy
    models load lazily on first call); a registered function gets `config` bound as keyword arguments."""
    entry = REWARDS[name]
    if inspect.isclass(entry):
        return entry(**config)
    return partial(entry, **config) if config else entry


class RewardSet:
    """Named rewards with weights: `RewardSet(["gsm8k", "gsm8k_accuracy"], [1.0, 0.5])`, or callables, or both.

    Args:
        rewards: registry names (`mmrl.rewards.REWARDS`) or reward callables (a TRL reward function unchanged).
        weights: one finite float per reward (default 1.0 each).
        on_error: "raise" (default) or "drop" (see the module docstring).
        timeout: seconds one call of a reward may take (None: no limit).
        retries: how many times a call that raised or timed out is re-run (0: none).
        retry_backoff: seconds before the first retry; doubled for each further retry (at most `MAX_BACKOFF`).
        memory_limit: bytes an isolated reward call (`mmrl.rewards.isolation`) may add under a timeout.
        reward_kwargs: per-reward configuration by name, e.g. `clip_score={"pretrained": "/path/to/weights"}`.
    """

    def __init__(self, rewards: Sequence[str | Callable], weights: Sequence[float] | None = None, *,
                 on_error: str = "raise", timeout: float | None = None, retries: int = 0, retry_backoff: float = 1.0,
                 memory_limit: int = DEFAULT_MEMORY_LIMIT, **reward_kwargs: Mapping[str, Any]):
        if isinstance(rewards, (str, bytes)) or callable(rewards):
            rewards = [rewards]
        if not rewards:
            raise ValueError("a RewardSet needs at least one reward")
        if on_error not in ("raise", "drop"):
            raise ValueError(f"on_error must be 'raise' or 'drop', got {on_error!r}")
        weights = [1.0] * len(rewards) if weights is None else list(weights)
        if len(weights) != len(rewards):
            raise ValueError(f"got {len(weights)} weights for {len(rewards)} rewards")
        if timeout is not None and not (isinstance(timeout, numbers.Real) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        if not (isinstance(retry_backoff, numbers.Real) and math.isfinite(retry_backoff) and retry_backoff >= 0):
            raise ValueError(f"retry_backoff must be a number of seconds >= 0, got {retry_backoff!r}")
        self.on_error = on_error
        self.timeout, self.retries, self.retry_backoff = timeout, retries, float(retry_backoff)
        self.memory_limit = int(memory_limit)
        specs = list(rewards)
        rewards = [_resolve(r) for r in specs]  # import paths (TRL's dotted paths, file.py:fn) become callables
        names = [reward_name(r) if isinstance(r, str) else reward_name(s) if isinstance(s, str) else _name_of(r)
                 for r, s in zip(rewards, specs)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"reward name(s) {dupes} appear more than once; each reward must have its own name")
        unknown_cfg = sorted(set(reward_kwargs) - set(names) - {s for s in specs if isinstance(s, str)})
        if unknown_cfg:
            raise ValueError(f"configuration given for {unknown_cfg}, which are not among the rewards {names}")
        self.rewards: list[_Reward] = []
        for r, spec, name, w in zip(rewards, specs, names, weights):
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
                raise ValueError(f"the weight of reward {name!r} must be a finite number, got {w!r}")
            cfg = dict(reward_kwargs.get(name) or (reward_kwargs.get(spec) if isinstance(spec, str) else None) or {})
            if isinstance(r, str) and is_reward_model_dir(r):
                fn = SequenceClassifierReward(r, **cfg)  # TRL's reward model by path (options: batch_size, ...)
            elif is_reward_model(r):
                fn = SequenceClassifierReward(r, **cfg)  # a reward model object
            elif isinstance(r, str):
                fn = build_reward(r, **cfg)
            elif callable(r):
                fn = partial(r, **cfg) if cfg else r
            else:
                raise TypeError(f"a reward is a registered name or a callable, got {type(r).__name__}")
            self.rewards.append(_Reward(name, fn, float(w), _accepted_params(fn), _is_async(fn)))
        # the worker process is forked on first use; killed when this RewardSet goes (or the interpreter exits)
        self._worker = WarmWorker({r.name: r.fn for r in self.rewards if not r.is_async}, self.memory_limit)
        self._async = AsyncRunner()
        weakref.finalize(self, self._worker.close)
        weakref.finalize(self, self._async.abandon)
        self._unpicklable: set[str] = set()

    def close(self) -> None:
        """Stop the worker process and the async event loop (they start again if the set is called again)."""
        self._worker.close()
        self._async.abandon()

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rewards]

    def missing_columns(self, columns: Sequence[str]) -> dict[str, list[str]]:
        """Reward name -> the parameters it requires (no default) that neither the trainer passes nor `columns`
        holds: a reward reading a dataset column the data lacks, found before training instead of at step 1."""
        given = set(columns) | TRAINER_ARGUMENTS
        out = {}
        for r in self.rewards:
            need = [p for p in _required_params(r.fn) if p not in given]
            if need:
                out[r.name] = need
        return out

    @property
    def weights(self) -> list[float]:
        return [r.weight for r in self.rewards]

    def __call__(self, prompts: Sequence, completions: Sequence, **columns: Any) -> RewardOutput:
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"got {len(prompts)} prompts for {n} completions (prompts are repeated per completion)")
        metrics: dict[str, float] = {}
        extras: dict[str, list] = {}
        valid = [True] * n
        self._failures: list[str] = []
        values: dict[str, list[float | None]] = {}
        first = self._run_async_rewards(prompts, completions, columns)
        for r in self.rewards:
            scores, logged = self._run(r, prompts, completions, columns, metrics, extras, valid, first=first.get(r.name))
            values[r.name] = scores
            for key, col in logged.items():
                extras[f"{r.name}/{key}"] = col
        scorable = [True] * n
        for i in range(n):
            if valid[i] and all(values[r.name][i] is None for r in self.rewards):
                scorable[i] = False
            elif valid[i]:
                weighted = math.fsum(values[r.name][i] * r.weight for r in self.rewards if values[r.name][i] is not None)
                if not abs(weighted) <= FLOAT32_MAX:
                    self._fail(valid, i, f"sample {i}: the weighted sum of its rewards, {weighted:g}, is beyond the float32 "
                                         f"range of the trainer's rewards (|r| <= {FLOAT32_MAX:.3g})")
        total = torch.zeros(n, dtype=torch.float64)
        per_reward = {}
        for r in self.rewards:
            col = [v if (v is not None and valid[i]) else float("nan") for i, v in enumerate(values[r.name])]
            col64 = torch.tensor(col, dtype=torch.float64)  # [N]
            per_reward[r.name] = col64.float()
            total += torch.nan_to_num(col64 * r.weight, nan=0.0)
            kept = [v for v in col if not math.isnan(v)]
            metrics[f"rewards/{r.name}/mean"] = sum(kept) / len(kept) if kept else float("nan")
            metrics[f"rewards/{r.name}/std"] = _std(kept)
        for key, col in list(extras.items()):
            nums = [v for i, v in enumerate(col) if valid[i] and isinstance(v, numbers.Real) and not isinstance(v, bool)
                    and math.isfinite(v)]
            bools = [float(v) for i, v in enumerate(col) if valid[i] and isinstance(v, bool)]
            if nums or bools:
                metrics[f"rewards/{key}/mean"] = sum(nums + bools) / len(nums + bools)
        valid_t = torch.tensor(valid, dtype=torch.bool)
        total[~valid_t] = 0.0
        total = total.float()  # [N]
        if self.on_error == "drop":
            metrics["rewards/dropped"] = float(n - sum(valid))
        if not all(scorable):
            _warn_unscorable(scorable.index(False), scorable.count(False), prompts, completions, columns)
        return RewardOutput(total, per_reward, metrics, extras, valid_t, tuple(self._failures),
                            torch.tensor(scorable, dtype=torch.bool))

    def _fail(self, valid: list[bool], i: int, message: str, cause: BaseException | None = None) -> None:
        if self.on_error == "raise":
            raise RewardError(message) from cause
        valid[i] = False
        self._note(message)

    def _note(self, message: str) -> None:
        failures = getattr(self, "_failures", None)
        if failures is not None and len(failures) < MAX_FAILURES_KEPT and message not in failures:
            failures.append(message)

    def _guarded_call(self, r: _Reward, prompts, completions, columns, metrics, extras, *, retries: int,
                      first: "_Outcome | None" = None):
        """`_call` with the timeout and up to `retries` retries with exponential backoff; `first` is the outcome
        of a first attempt already made (async rewards, run concurrently beforehand)."""
        for attempt in range(retries + 1):
            try:
                if attempt == 0 and first is not None:
                    return first.unwrap(metrics, extras)
                return self._timed_call(r, prompts, completions, columns, metrics, extras)
            except Exception as e:
                if attempt == retries:
                    raise
                delay = min(self.retry_backoff * 2**attempt, MAX_BACKOFF)
                warnings.warn(f"reward {r.name!r} failed ({type(e).__name__}: {e}); retry {attempt + 1} of {retries} "
                              f"in {delay:.3g} s", RuntimeWarning, stacklevel=2)
                time.sleep(delay)

    def _timed_call(self, r: _Reward, prompts, completions, columns, metrics, extras):
        if r.is_async:
            return self._async_call(r, prompts, completions, columns, metrics, extras)
        if self.timeout is None:
            return self._call(r, prompts, completions, columns, metrics, extras)
        if not runs_in_process(r.fn) and r.name not in self._unpicklable:
            try:
                return self._worker_call(r, prompts, completions, columns, metrics, extras)
            except NotPicklable as e:
                self._unpicklable.add(r.name)
                warnings.warn(f"reward {r.name!r}: {e}; it runs in a thread of the trainer instead, where a call stuck "
                              "in native code cannot be stopped at the deadline", RuntimeWarning, stacklevel=3)
        return self._thread_call(r, prompts, completions, columns, metrics, extras)

    def _worker_call(self, r: _Reward, prompts, completions, columns, metrics, extras):
        """The call in the warm worker process, killed at the deadline (`WarmWorker`)."""
        kwargs = self._kwargs(r, prompts, completions, columns, {}, {})
        want_logs = "log_metric" in kwargs or "log_extra" in kwargs
        kwargs.pop("log_metric", None)
        kwargs.pop("log_extra", None)
        try:
            out, own_metrics, own_extras = self._worker.call(r.name, kwargs, want_logs, self.timeout)
        except ChildTimeout:
            raise RewardTimeout(f"reward {r.name!r} did not return within {self.timeout:g} s on {len(completions)} samples "
                                "(timeout; its worker process was killed)") from None
        except ChildFailed as e:
            raise RewardUnavailable(f"reward {r.name!r} {e}") from None
        metrics.update(own_metrics)
        extras.update(own_extras)
        return out

    def _thread_call(self, r: _Reward, prompts, completions, columns, metrics, extras):
        """The call in a worker thread of this process, interrupted at the deadline (`in_process` rewards)."""
        # the call logs into its own dicts, merged only if it finishes in time
        own_metrics: dict[str, float] = {}
        own_extras: dict[str, list] = {}
        box: dict[str, Any] = {}

        def work():
            try:
                box["out"] = self._call(r, prompts, completions, columns, own_metrics, own_extras)
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e

        worker = threading.Thread(target=work, name=f"reward-{r.name}", daemon=True)
        worker.start()
        try:
            join_by(worker, self.timeout)
        except BaseException:  # interrupted (Ctrl-C / SIGTERM): stop the work too
            stop_thread(worker, _Abandoned)
            raise
        if worker.is_alive():
            stopped = stop_thread(worker, _Abandoned)  # stops Python code; native code runs on
            raise RewardTimeout(f"reward {r.name!r} did not return within {self.timeout:g} s on {len(completions)} "
                                "samples (timeout" + ("" if stopped else "; its thread is blocked in native code and could "
                                                      "not be stopped") + ")")
        if "error" in box:
            raise box["error"]
        metrics.update(own_metrics)
        extras.update(own_extras)
        return box["out"]

    def _async_call(self, r: _Reward, prompts, completions, columns, metrics, extras):
        """An async reward on the event-loop thread, waited for with the deadline (`AsyncRunner`)."""
        outcome = _Outcome()
        coro = r.fn(**self._kwargs(r, prompts, completions, columns, outcome.metrics, outcome.extras))
        self._settle(r, outcome, self._async.run({r.name: _await(coro)}, self.timeout)[r.name], len(completions))
        return outcome.unwrap(metrics, extras)

    def _settle(self, r: _Reward, o: "_Outcome", result: tuple[str, Any], n: int) -> None:
        kind, value = result
        if kind == "ok":
            o.value = value
        elif kind == "timeout":
            o.metrics, o.extras = {}, {}  # a late coroutine may still log into the old ones: never read
            o.error = RewardTimeout(f"reward {r.name!r} did not return within {self.timeout:g} s on {n} samples (timeout; "
                                    "the coroutine was cancelled and a late result is not used)")
        else:
            o.error = value

    def _kwargs(self, r: _Reward, prompts, completions, columns, metrics, extras) -> dict:
        kwargs = dict(columns)
        kwargs["log_metric"] = lambda name, value: metrics.__setitem__(name, float(value))
        kwargs["log_extra"] = lambda column, vals: extras.__setitem__(column, list(vals))
        kwargs["prompts"], kwargs["completions"] = prompts, completions
        if r.params is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in r.params}
        return kwargs

    def _call(self, r: _Reward, prompts, completions, columns, metrics, extras):
        out = r.fn(**self._kwargs(r, prompts, completions, columns, metrics, extras))
        if inspect.isawaitable(out):  # a plain function that returned a coroutine
            result = self._async.run({r.name: _await(out)}, self.timeout)[r.name]
            o = _Outcome()
            self._settle(r, o, result, len(completions))
            out = o.unwrap({}, {})
        return out

    def _run_async_rewards(self, prompts, completions, columns) -> dict[str, "_Outcome"]:
        """First attempt of every async reward, all at once on the event-loop thread (concurrently, as TRL's
        `asyncio.gather`), each bounded by `timeout`; name -> outcome. Retries and the one-sample-at-a-time search
        run afterwards, per reward, as for synchronous rewards."""
        todo = [r for r in self.rewards if r.is_async]
        if not todo:
            return {}
        outcomes = {r.name: _Outcome() for r in todo}
        coros = {}
        for r in todo:
            o = outcomes[r.name]
            try:
                coros[r.name] = _await(r.fn(**self._kwargs(r, prompts, completions, columns, o.metrics, o.extras)))
            except Exception as e:  # raised before returning a coroutine
                o.error = e
        for name, result in self._async.run(coros, self.timeout).items():
            r = next(x for x in todo if x.name == name)
            self._settle(r, outcomes[name], result, len(completions))
        return outcomes

    def _run(self, r, prompts, completions, columns, metrics, extras, valid, first: "_Outcome | None" = None):
        n = len(completions)
        try:
            out = self._guarded_call(r, prompts, completions, columns, metrics, extras, retries=self.retries, first=first)
        except RewardUnavailable as e:  # nothing to locate: the whole batch failed
            if self.on_error == "raise":
                raise RewardError(f"reward {r.name!r} could not score samples 0..{n - 1}: {e}") from e
            valid[:] = [False] * n
            self._note(f"reward {r.name!r} could not score samples 0..{n - 1}: {e}")
            return [None] * n, {}
        except Exception as e:  # locate the failing sample(s) by scoring one at a time
            return self._run_one_by_one(r, prompts, completions, columns, metrics, extras, valid, e)
        if isinstance(out, torch.Tensor):
            out = out.detach().cpu().tolist()
        elif hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
            out = out.tolist()
        if not isinstance(out, (list, tuple)):
            raise RewardError(f"reward {r.name!r} returned {type(out).__name__}; a reward returns a list with one value per completion")
        if len(out) != n:
            raise RewardError(f"reward {r.name!r} returned {len(out)} values for {n} completions")
        scores: list[float | None] = [None] * n
        logged: dict[str, list] = {}
        for i, v in enumerate(out):
            try:
                scores[i], extra = _check_value(v)
            except Exception as e:  # RewardError, or an odd object that fails even to be inspected
                detail = str(e) if isinstance(e, RewardError) else f"unusable value ({type(e).__name__}: {e})"
                self._fail(valid, i, f"reward {r.name!r}, sample {i}: {detail}", e)
                continue
            for key, val in extra.items():
                logged.setdefault(key, [None] * n)[i] = val
        return scores, logged

    def _run_one_by_one(self, r, prompts, completions, columns, metrics, extras, valid, batch_error):
        n = len(completions)
        scores: list[float | None] = [None] * n
        logged: dict[str, list] = {}
        failed = False
        unavailable: RewardUnavailable | None = None
        for i in range(n):
            if unavailable is not None:  # e.g. a per-sample timeout: do not wait once per remaining sample
                self._fail(valid, i, f"reward {r.name!r}, sample {i}: not scored ({unavailable})", unavailable)
                continue
            cols = {k: (v[i : i + 1] if isinstance(v, (list, tuple)) and len(v) == n else v) for k, v in columns.items()}
            try:
                out = self._guarded_call(r, prompts[i : i + 1], completions[i : i + 1], cols, metrics, extras, retries=0)
                if isinstance(out, torch.Tensor) or (hasattr(out, "tolist") and not isinstance(out, (list, tuple))):
                    out = out.tolist()
                if not isinstance(out, (list, tuple)) or len(out) != 1:
                    raise RewardError(f"returned {out!r} for one completion")
                scores[i], extra = _check_value(out[0])
                for key, val in extra.items():
                    logged.setdefault(key, [None] * n)[i] = val
            except Exception as e:
                failed = True
                if isinstance(e, RewardUnavailable):
                    unavailable = e
                detail = str(e) if isinstance(e, RewardError) else f"raised {type(e).__name__}: {e}"
                self._fail(valid, i, f"reward {r.name!r}, sample {i}: {detail}", e)
        if not failed:
            raise RewardError(f"reward {r.name!r} raised {type(batch_error).__name__}: {batch_error} on the batch, "
                              "but on no single sample") from batch_error
        return scores, logged


UNSCORABLE_HIDDEN_COLUMNS = ("trainer_state", "log_extra", "log_metric", "completion_ids")
"""Reward arguments the unscorable-sample warning leaves out (TRL leaves out the first three)."""


def _warn_unscorable(i: int, count: int, prompts: Sequence, completions: Sequence, columns: Mapping[str, Any]) -> None:
    """TRL's warning for a sample no reward applies to: its prompt, completion and columns (the first such sample)."""
    row = {k: (v[i] if isinstance(v, (list, tuple)) and len(v) == len(completions) else v)
           for k, v in columns.items() if k not in UNSCORABLE_HIDDEN_COLUMNS}
    row = {"prompt": prompts[i], "completion": completions[i], **row}
    logger.warning("every reward returned None for %d sample(s); they get advantage 0. The first, sample %d: %s. "
                   "Make sure at least one reward returns a value for every sample.", count, i, _short_repr(row, 500))


async def _await(x):
    return await x


@dataclass
class _Outcome:
    """What one call of a reward gave: its value or its exception, and what it logged."""

    value: Any = None
    error: BaseException | None = None
    metrics: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)

    def unwrap(self, metrics: dict, extras: dict):
        if self.error is not None:
            raise self.error
        metrics.update(self.metrics)
        extras.update(self.extras)
        return self.value


def _is_async(fn: Callable) -> bool:
    """An `async def` function, a partial of one, or an object whose `__call__` is one (TRL `is_async_callable`)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _resolve(r: Any) -> Any:
    """A reward spec as RewardSet uses it: registered names stay names, import paths become the callables."""
    if isinstance(r, str) and r not in REWARDS and not is_reward_model_dir(r) and is_import_path(r):
        return import_reward(r)
    return r


def _check_value(v: Any) -> tuple[float | None, dict]:
    """(score or None, logged extras) of one returned value; raises RewardError on anything else."""
    extra: dict = {}
    if isinstance(v, Mapping):
        if "score" not in v:
            raise RewardError(f"a dict reward needs a 'score' key, got keys {sorted(v)}")
        extra = {k: x for k, x in v.items() if k != "score"}
        v = v["score"]
    if v is None:
        return None, extra
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict)):
        try:
            v = v.item()
        except (ValueError, RuntimeError):
            raise RewardError(f"returned an array of shape {getattr(v, 'shape', '?')} where one number was expected") from None
    if isinstance(v, bool):
        v = float(v)
    if not isinstance(v, numbers.Real):
        raise RewardError(f"returned {type(v).__name__} {_short_repr(v)}; a reward value is a number, None, or a dict with 'score'")
    try:
        v = float(v)
    except OverflowError:
        raise RewardError(f"returned {_short_repr(v)}, too large for a float") from None
    if not math.isfinite(v):
        raise RewardError(f"returned {v}, which is not finite")
    if abs(v) > FLOAT32_MAX:
        raise RewardError(f"returned {v:g}, beyond the float32 range of the trainer's rewards (|r| <= {FLOAT32_MAX:.3g})")
    return v, extra


def _short_repr(v: Any, limit: int = 80) -> str:
    try:
        text = repr(v)
    except Exception as e:  # an object whose repr fails
        text = f"<{type(v).__name__}, repr failed: {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _std(xs: list[float]) -> float:
    """Sample standard deviation (n - 1), as TRL logs `rewards/<name>/std`; 0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
