"""The one RL training loop of mmrl: every method on every model family (docs/design.md, "The data flow of one step").

    for step in range(max_steps):
        if the buffer is stale (every num_iterations steps):
            1. draw a batch of prompts                      (each process its own share)
            2. sample G responses each                      policy.sample
            3. score them with the rewards                  RewardSet (weighted sum, per-reward metrics)
            4. group advantages                             group_advantages
            5. the method's per-response quantities          method.prepare (behaviour / reference log-probs, weights)
        6. one optimizer step over the buffer, micro-batched with gradient accumulation     method.loss
        7. log metrics (TRL names), checkpoint, token-credit pictures

Model differences live in the adapters (`mmrl.models`, class attributes for what the loop must know), method
differences in `mmrl.methods` (one file each, built on the pure functions of `mmrl.algorithms`); this file only
wires them and never tests a method's or a family's name. Every random stream is derived from (seed, what, index), so a
resumed run continues exactly like an uninterrupted one. accelerate owns devices and distribution.
"""
from __future__ import annotations

import datetime
import functools
import math
import os
import signal
import time
import warnings
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mmrl.training import grad_checkpointing
from mmrl.training.advantages import compute_advantages, overlong_penalty
from mmrl.reporting.batch_report import (add_failures, clip_extremes, impute_unscorable, peak_memory_gb, per_reward_metrics, reward_metrics,
                               scorable_group_std, unfilled_batch_message)
from mmrl.training.buffer import Buffer, concat_rollouts
from mmrl.checkpointing.checkpoint import latest_checkpoint, save_checkpoint
from mmrl.reporting.completions import completion_rows, length_metrics, terminated, with_advantages
from mmrl.config.train_config import TrainConfig
from mmrl.training.datasets import check_reward_columns, training_data
from mmrl.core.diagnostics import finish_step_metrics, logged_step, snapshot
from mmrl.training.epochs import eval_interval, resolve_max_steps
from mmrl.core.faults import fault_point  # test hook: MMRL_KILL_AT=<point>:K kills the process there (crash tests)
from mmrl.reporting.metrics_log import MetricLogger
from mmrl.core.optim import build_optimizer, build_scheduler
from mmrl.methods import METHODS, MicroBatch, behaviour_is_current
from mmrl.training.peer_failure import is_peer_failure, peer_failure_message
from mmrl.training.process_group import destroy_at_exit
from mmrl.training.policy_factory import (attach_rollout_engine, build_policy, check_model_source, ensure_lora, estimator_options, family_class,
                                          generation_options, mix_into_reference, set_generation_defaults, wants_reference)
from mmrl.training.prompt_stream import PromptStream
from mmrl.core.protocol import Rollout
from mmrl.training.reward_inputs import build_eval_rewards, build_rewards, make_trainer_state, response_columns, reward_arguments
from mmrl.core.seeds import derived_seed
from mmrl.training.stop_signals import RewardsInterrupted, StopRequests
from mmrl.checkpointing.checkpoint import CheckpointDamaged, CheckpointIncompatible, load_checkpoint, load_model_weights
from mmrl.checkpointing.rank_state import Ranks, load_optimizer_shard, optimizer_shard_file, restore_rng
from mmrl.checkpointing.resume_settings import apply_resume_settings, check_before_loading, check_dataset_unchanged, dataset_digest
from mmrl.checkpointing.run_lock import RunLock
from mmrl.checkpointing.resume import resume_run, save_model_dir
from mmrl.checkpointing.optimizer_state import init_adamw_from, load_adamw_state, named_trainable, pretraining_optimizer_file
from mmrl.checkpointing.sharded_save import gather_full_state_dict, optimizer_is_sharded


class TrainingError(RuntimeError):
    """The run cannot continue (e.g. repeated non-finite steps, dynamic sampling cannot fill a batch)."""


class TrainingStopped(KeyboardInterrupt):
    """SIGTERM or Ctrl-C (SIGINT) stopped the run at the end of a step, after writing a checkpoint of that step."""

    def __init__(self, message: str, signum: int, checkpoint: Path | None):
        super().__init__(message)
        self.signum, self.checkpoint = signum, checkpoint


def _release_lock_on_failure(init):
    """`Trainer.__init__` that gives the output_dir lock back when it raises (a failed start leaves no lock held)."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except BaseException:
            lock = getattr(self, "_lock", None)
            if lock is not None:
                lock.release()
            raise

    return wrapper



def initial_optimizer_file(cfg) -> Path | None:
    """The base's pre-training AdamW state file a fresh run with `init_optimizer_from_base` starts from
    (`mmrl.checkpointing.optimizer_state.pretraining_optimizer_file`, a one-line error for a base without it);
    None when the option is off or the run resumes (the checkpoint's optimizer state wins)."""
    if not cfg.init_optimizer_from_base or cfg.resume_from:
        return None
    if cfg.use_peft:
        raise ValueError("init_optimizer_from_base with use_peft: the LoRA parameters have no pre-training optimizer state")
    return pretraining_optimizer_file(str(cfg.model_name_or_path))

class Trainer:
    """Runs `cfg` (see `mmrl.config.train_config.TrainConfig`); also takes TRL's `GRPOTrainer` call form
    (`mmrl.training.trl_api`): `Trainer(model=..., reward_funcs=..., args=..., train_dataset=..., peft_config=...)`.

    Args:
        cfg: the configuration (validated here, before any model is loaded); TRL's `args=` is the same. A model
            path or object in this place is TRL's positional `model`.
        model: a local model directory or a transformers model object; the family is picked from it.
        train_dataset, eval_dataset: TRL's names (a `datasets.Dataset` or rows) for `dataset` / `eval_dataset`.
        peft_config: a peft `LoraConfig` (DoRA, rsLoRA, ... as peft takes them) applied to the model.
        processing_class: the tokenizer or processor of a model object (default: the one saved beside it).
        policy: an adapter to train instead of building one from `cfg` (Python API).
        dataset: rows `{"prompt": ..., <columns passed to the rewards>}` instead of `cfg.task`'s training split.
        reward_funcs: reward names or callables `fn(prompts, completions, **kwargs) -> list[float | None]` instead
            of `cfg.reward_funcs` / the task's defaults (TRL reward functions work unchanged).
        eval_dataset, eval_metric: test rows and the reward whose mean is the accuracy, for `eval_steps` (default:
            the task's test split and metric).
    """

    @_release_lock_on_failure
    def __init__(self, cfg: TrainConfig | Any = None, reward_funcs: Sequence[str | Callable] | str | Callable | None = None, *,
                 policy=None, dataset: Sequence[dict] | None = None, eval_dataset: Sequence[dict] | None = None,
                 eval_metric: str | None = None, model=None, args: TrainConfig | dict | None = None, train_dataset=None,
                 peft_config=None, processing_class=None):
        from mmrl.training.trl_api import resolve_call

        if cfg is not None and not isinstance(cfg, (TrainConfig, dict)) and model is None:
            cfg, model = None, cfg  # TRL's positional form: Trainer(model, reward_funcs, args=...)
        cfg, given, train_rows, eval_rows = resolve_call(cfg, args, model, peft_config, processing_class, train_dataset,
                                                         eval_dataset)
        policy = policy if policy is not None else given
        dataset = dataset if dataset is not None else train_rows
        eval_dataset = eval_rows
        if reward_funcs is not None and (isinstance(reward_funcs, (str, bytes)) or callable(reward_funcs)):
            reward_funcs = [reward_funcs]  # TRL: one reward function alone
        self._peft_config = peft_config
        cfg.validate()
        self.cfg = cfg
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

        self.family = family_class(cfg)  # what the trainer needs to know of a family, as class attributes
        ddp = DistributedDataParallelKwargs(find_unused_parameters=self.family.has_unused_parameters)
        # accelerate only picks gloo (MULTI_CPU) when told to use the CPU; a torchrun-style multi-process launch on a
        # machine without an accelerator would otherwise give N independent single-process runs
        cpu_ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
        pg = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=cfg.ddp_timeout))  # a frozen peer: an error, not a hang
        self.accelerator = Accelerator(mixed_precision=cfg.mixed_precision, kwargs_handlers=[ddp, pg], cpu=cpu_ddp)
        if self.accelerator.num_processes > 1:
            destroy_at_exit()  # the group ends before interpreter teardown, where gloo's threads can abort the process
        self.is_main = self.accelerator.is_main_process
        self.run_dir = Path(cfg.output_dir)
        if not cfg.resume_from and (found := latest_checkpoint(self.run_dir)) is not None:
            # a fresh run here would rotate out its own new checkpoints (older step numbers) and reset metrics.jsonl
            raise TrainingError(f"output_dir {str(self.run_dir)!r} already holds checkpoints of a run (latest: {found.name}); "
                                "resume it with resume_from=auto, or choose a new output_dir")
        if cfg.resume_from:
            check_before_loading(cfg, self.run_dir)  # settings that cannot change on resume, before the model loads
        self._lock = RunLock(self.run_dir)
        if self.is_main:
            # held from here: of two trainers started together on one output_dir, the second stops before either loads
            # a model (released if __init__ fails, `_release_lock_on_failure`)
            self._lock.acquire()
            self.run_dir.mkdir(parents=True, exist_ok=True)
        # data and rewards before the model: a bad model path, task, dataset or reward fails fast
        own_rewards = bool(reward_funcs or cfg.reward_funcs)  # the user's rewards, not the task's defaults
        explicit_metric = eval_metric is not None
        dataset, reward_funcs, eval_dataset, eval_metric = training_data(cfg, dataset, reward_funcs, eval_dataset, eval_metric)
        if policy is None:
            check_model_source(cfg)
        opt_file = initial_optimizer_file(cfg)  # a base without its optimizer state: an error now, not after loading
        self.eval_dataset = list(eval_dataset or [])[: cfg.eval_limit] if cfg.eval_limit else list(eval_dataset or [])
        self.eval_metric = eval_metric
        self.rewards = build_rewards(cfg, reward_funcs)
        # what the periodic evaluation scores: eval_reward_funcs; else the task's metric when the rewards are the
        # task's own (or eval_metric= is given); else the training rewards, as TRL evaluates
        self.eval_rewards = None
        if cfg.eval_reward_funcs:
            self.eval_rewards = build_eval_rewards(cfg)
        elif not explicit_metric and (own_rewards or not self.eval_metric):
            self.eval_rewards = self.rewards
        self.dataset = list(dataset)
        self._dataset_sha256 = dataset_digest(self.dataset)
        if cfg.resume_from:
            check_dataset_unchanged(cfg, self.run_dir, self._dataset_sha256)  # before the model loads
        check_reward_columns(cfg, self.rewards, self.dataset)  # a reward reads a column the data lacks: now, not at step 1
        cfg.max_steps = resolve_max_steps(cfg, len(self.dataset), self.accelerator.num_processes)  # TRL's num_train_epochs
        self.eval_every = eval_interval(cfg, len(self.dataset), self.accelerator.num_processes)  # eval_steps / eval_strategy
        if self.eval_every and not self.eval_dataset:
            raise ValueError("evaluation (eval_steps > 0 or eval_strategy) needs evaluation rows: a task or dataset with a "
                             "test / validation split, eval_split=..., or eval_dataset=")
        self.policy = policy if policy is not None else build_policy(cfg, device=self.accelerator.device)
        set_generation_defaults(self.policy, generation_options(cfg))  # the config's sampling options, also for a given policy
        self.policy.model = ensure_lora(self.policy.model, cfg, self._peft_config)
        attach_rollout_engine(self.policy, cfg)  # use_vllm; after LoRA, whose merged weights the engine is given
        if cfg.gradient_checkpointing:
            grad_checkpointing.enable(self.policy.model)
        self.policy.model.eval()  # dropout off (ratio exactly 1 at the first inner step)
        if policy is not None and wants_reference(cfg, self.policy):
            import copy

            self.policy.ref_model = copy.deepcopy(self.policy.unwrapped).requires_grad_(False).eval()
        self.method = METHODS[cfg.method](cfg, self.policy, partial(estimator_options, cfg))
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, cfg)  # `optim`: the AdamW variant (mmrl.core.optim)
        if opt_file is not None:  # init_optimizer_from_base: the pre-training moments instead of zeros
            init_adamw_from(self.optimizer, named_trainable(self.policy.model), load_adamw_state(opt_file), source=str(opt_file))
        self.scheduler = build_scheduler(self.optimizer, cfg)  # warmup_steps (or its ratio form), lr_scheduler_kwargs
        self.policy.model, self.optimizer = self.accelerator.prepare(self.policy.model, self.optimizer)
        if self.policy.ref_model is not None:
            self.policy.ref_model.to(self.accelerator.device)
        self.world = self.accelerator.num_processes
        self.rank = self.accelerator.process_index
        self.step = 0
        self.rollout_index = 0
        self.nonfinite_in_a_row = 0
        self.num_tokens = 0
        self._completions_table: list[dict] = []
        self.buffer: Buffer | None = None
        self.stream = PromptStream(self.dataset, cfg.seed, self.rank, self.world)
        self._stop = StopRequests()

    # ================================================================================================ the loop

    def train(self) -> dict[str, Any]:
        """Train for `max_steps` optimizer steps (resuming if asked); returns the last step's metrics."""
        if self.is_main:
            self._lock.acquire()  # again if an earlier train() released it
        try:
            resumed = self._maybe_resume()
        except BaseException:
            self._lock.release()
            raise
        cfg = self.cfg  # resuming may restore settings from the checkpoint
        logger = MetricLogger(self.run_dir, cfg.report_to, config=cfg.to_dict(), resume_step=self.step if resumed else None, enabled=self.is_main)
        bar = None
        if self.is_main and cfg.progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.max_steps, initial=self.step, desc=f"{cfg.method} on {cfg.family}", unit="step", dynamic_ncols=True)
        last: dict[str, Any] = {}
        old_handlers = self._stop.install()
        try:
            while self.step < cfg.max_steps:
                t_step = time.perf_counter()
                if self.buffer is None or self.step % cfg.steps_per_rollout == 0:
                    self.buffer = self._collect_or_stop(logger)  # steps 1-5
                    self.rollout_index += 1
                # TRL's order: each pass (num_iterations) goes through the steps_per_generation slices in turn
                inner, part = divmod(self.step % cfg.steps_per_rollout, cfg.steps_per_pass)
                metrics = self._optimizer_step(self.buffer, inner, part)  # step 6
                self.step += 1
                self._maybe_sync_reference()  # TRL: after optimizer step global_step, when it is a multiple
                metrics.update(self.buffer.metrics)
                metrics["perf/step_time"] = time.perf_counter() - t_step
                metrics["perf/peak_mem_gb"] = peak_memory_gb(self.accelerator.device)
                metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
                metrics["epoch"] = self.stream.position * self.world / len(self.dataset)
                last = metrics
                if self.eval_every and (self.step % self.eval_every == 0 or self.step == cfg.max_steps):
                    self._evaluate_or_save(metrics, logger)
                if logged_step(cfg, self.step):  # step 7
                    logger.log(self.step, metrics)
                    logger.log_completions(self.step, self._completions_table)  # each rollout batch once
                    self._completions_table = []
                if cfg.credit_steps and self.step % cfg.credit_steps == 0 and self.is_main:
                    self._write_credit_pictures(self.buffer)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{metrics.get('reward', float('nan')):.3f}", loss=f"{metrics.get('loss', float('nan')):.4f}")
                saved = None
                if (cfg.save_steps and self.step % cfg.save_steps == 0) or self.step == cfg.max_steps:
                    logger.sync()  # the logs reach the disk before the checkpoint that vouches for them
                    saved = self.save()
                fault_point("after_step", self.step)
                signum = self._stop.agreed(self.world, self.accelerator.device)
                if signum and self.step < cfg.max_steps:
                    if saved is None:
                        logger.sync()
                    path = saved or self.save()
                    name = signal.Signals(signum).name
                    raise TrainingStopped(f"stopped by {name} after step {self.step}; checkpoint written to {path}; "
                                          "resume with resume_from=auto", signum, path)
            if self.step >= cfg.max_steps:  # TRL's scripts end with trainer.save_model(output_dir)
                self.save_model()
                if cfg.push_to_hub:
                    self.push_to_hub()
        except RuntimeError as e:
            if self.world > 1 and is_peer_failure(e):
                raise TrainingError(peer_failure_message(e, self.cfg.ddp_timeout, self.rank, latest_checkpoint(self.run_dir))) from e
            raise
        finally:
            self._stop.restore(old_handlers)
            if bar is not None:
                bar.close()
            logger.close()
            self._lock.release()
        return last

    def _collect_or_stop(self, logger: MetricLogger) -> Buffer:
        """`_collect`; if SIGTERM / Ctrl-C stops the rewards (`RewardsInterrupted`), the prompts drawn for this batch
        are given back, the checkpoint of the last finished step is written and the run stops (`TrainingStopped`)."""
        position = self.stream.position
        try:
            return self._collect()
        except RewardsInterrupted as e:
            self.stream.position = position  # a resumed run draws this batch again, as an uninterrupted one did
            name = signal.Signals(e.signum).name
            if self.step == 0:
                raise TrainingStopped(f"stopped by {name} during the rewards of step 1; no step had finished, so there "
                                      "is no checkpoint", e.signum, None) from None
            logger.sync()
            path = self.save()
            raise TrainingStopped(f"stopped by {name} during the rewards of step {self.step + 1}; checkpoint of step "
                                  f"{self.step} written to {path}; resume with resume_from=auto", e.signum, path) from None

    def _evaluate_or_save(self, metrics: dict, logger: MetricLogger) -> None:
        """The evaluation of this step into `metrics`; if it fails, the step's work is kept first (its metrics logged,
        a checkpoint written) and the error re-raised naming the checkpoint."""
        try:
            metrics.update(self.evaluate())
        except Exception as e:
            if self.world > 1:
                raise  # the other processes may be inside the evaluation's collectives: no checkpoint barrier now
            logger.log(self.step, metrics)
            logger.sync()
            path = self.save()
            raise TrainingError(f"evaluation at step {self.step} failed ({type(e).__name__}: {e}); the step's checkpoint "
                                f"was written first, to {path}: fix the evaluation, then resume with resume_from=auto") from e

    def evaluate(self) -> dict[str, float]:
        """The evaluation rows scored (each process its share; the means are over all of them): `eval/reward` and
        `eval/rewards/<name>/mean` with rewards, `eval/accuracy` with a task metric."""
        from mmrl.training.evaluate import evaluate_during_training, evaluate_rewards_during_training

        if self.eval_rewards is not None:
            return evaluate_rewards_during_training(self.policy, self.eval_dataset, self.eval_rewards, self.cfg,
                                                    self.accelerator, self.rank, self.world)
        return evaluate_during_training(self.policy, self.eval_dataset, self.eval_metric, self.cfg, self.accelerator,
                                        self.rank, self.world)

    # ======================================================================================= 1-5: the buffer

    def _collect(self) -> Buffer:
        """Draw prompts, sample, score, and compute every per-response quantity the updates need."""
        cfg, policy = self.cfg, self.policy
        G = cfg.num_generations
        need = cfg.prompts_per_rollout
        kept: list[Rollout] = []
        kept_rewards: list[torch.Tensor] = []
        kept_scorable: list[torch.Tensor] = []  # [n] False where no reward applied (TRL: advantage 0)
        kept_columns: list[dict[str, list]] = []  # the kept rows' dataset columns, one value per response
        table: list[dict] = []  # log_completions: one row per kept response
        reward_logs: dict[str, list[float]] = {}
        per_reward_seen: dict[str, list[torch.Tensor]] = {}  # every scored sample of every try, for rewards/<fn>/*
        stats = {"dropped_groups": 0, "zero_std_groups": 0, "groups_seen": 0, "sample_time": 0.0, "reward_time": 0.0,
                 "dropped": 0, "sampled": 0}
        failures: list[str] = []  # the rewards' own messages for dropped samples (quoted if the batch cannot be filled)
        tries = 0
        while sum(r.num_groups for r in kept) < need:
            tries += 1
            if tries > cfg.dynamic_sampling_max_tries:
                raise TrainingError(unfilled_batch_message(
                    dynamic_sampling=cfg.dynamic_sampling, max_tries=tries - 1, usable=sum(r.num_groups for r in kept), need=need,
                    zero_std=stats["zero_std_groups"], seen=stats["groups_seen"], dropped=stats["dropped_groups"],
                    failures=failures, checkpoint=latest_checkpoint(self.run_dir)))
            todo = need - sum(r.num_groups for r in kept)
            draw = need if tries == 1 else max(todo, 1)
            items = self.stream.take(draw)
            rows = [row for _, row in items]
            seeds = [derived_seed(cfg.seed, "sample", g, j) for g, _ in items for j in range(G)]
            ts = time.perf_counter()
            rollout = policy.sample([row["prompt"] for row in rows], G, seeds=seeds)
            stats["sampled"] += len(rows) * G  # this process's responses sampled, kept or not
            fault_point("during_rollout", self.step + 1)
            stats["sample_time"] += time.perf_counter() - ts
            ts = time.perf_counter()
            state = make_trainer_state(self.step, cfg.max_steps, self.stream.position * self.world / len(self.dataset))
            r_prompts, r_completions, r_columns = reward_arguments(rollout, rows, G, trainer_state=state)  # TRL's arguments
            with self._stop.interrupting(self.world == 1):  # one process: a stop signal stops a slow reward at once
                out = self.rewards(r_prompts, r_completions, **r_columns)
            stats["reward_time"] += time.perf_counter() - ts
            add_failures(failures, out.failures)
            total = out.total.to(torch.float32)  # [N]
            scorable = out.scorable if out.scorable is not None else torch.ones_like(out.valid)  # [N]
            if cfg.overlong_penalty and self.family.variable_length:
                pen = overlong_penalty(rollout, cfg)  # [N]
                total = total + pen
                reward_logs.setdefault("rewards/overlong/mean", []).append(float(pen.mean()))
            for name, val in out.metrics.items():
                if name == "rewards/dropped":
                    stats["dropped"] += int(val)  # a count over the tries, not a mean
                elif not (name.startswith("rewards/") and name.rsplit("/", 1)[-1] in ("mean", "std") and name.count("/") == 2
                          and name.split("/")[1] in out.per_reward):
                    reward_logs.setdefault(name, []).append(float(val))
            for name, col in out.per_reward.items():
                per_reward_seen.setdefault(name, []).append(col)
            valid = out.valid.view(-1, G).all(-1)  # [B] groups whose rewards are all usable
            stats["dropped_groups"] += int((~valid).sum())
            zero = scorable_group_std(total, scorable, G) == 0  # [B] (fewer than 2 scorable: no spread either)
            stats["groups_seen"] += int(valid.numel())
            stats["zero_std_groups"] += int((zero & valid).sum())
            keep = valid & ~zero if cfg.dynamic_sampling else valid
            if tries == 1:
                first_total, first_valid, first_scorable = total, valid, scorable  # TRL's reward metrics: the sampled batch
            keep_rows = keep.repeat_interleave(G)
            if keep_rows.any():
                idx = torch.nonzero(keep_rows).flatten()
                kept.append(rollout.select(idx))
                kept_rewards.append(total[idx.to(total.device)])
                kept_scorable.append(scorable[idx.to(scorable.device)])
                kept_columns.append(response_columns(r_columns, idx.tolist(), rollout.num_responses))
                if cfg.log_completions:
                    table += completion_rows(r_prompts, r_completions, out.per_reward, idx.tolist(), extras=out.extras)
        rollout = concat_rollouts(kept)
        rewards = torch.cat(kept_rewards)
        scorable = torch.cat(kept_scorable)
        columns = {k: [v for c in kept_columns for v in c[k]] for k in (kept_columns[0] if kept_columns else {})}
        if rollout.num_groups > need:  # refills may overshoot: keep whole groups only
            rollout = rollout.select(torch.arange(need * G))
            rewards, scorable = rewards[: need * G], scorable[: need * G]
            columns = {k: v[: need * G] for k, v in columns.items()}
        with torch.no_grad():  # the method's own reward shaping (e.g. STAGE's entropy reward), before the advantages
            rewards, shaping = self.method.shape_rewards(rollout, rewards, self._micro_batches, self.rollout_index)
        for name, val in shaping.items():
            reward_logs.setdefault(name, []).append(val)
        if not bool(scorable.all()):
            # methods that read the rewards themselves (DMPO's weights) see the group mean of the scorable ones:
            # neutral within the group, as the advantage 0 is for the policy-gradient methods
            rewards = impute_unscorable(rewards, scorable, G)
        t_sampled = time.perf_counter()
        # 4. advantages (weight-based methods such as DMPO keep them for logging only)
        advantages = self._advantages(rewards.to(self.accelerator.device), scorable.to(self.accelerator.device))
        if cfg.log_completions:
            self._completions_table = with_advantages(table[: rollout.num_responses], advantages, rewards)
        loss_mask = rollout.response_mask.clone()
        is_terminated = terminated(rollout).to(loss_mask.device)  # [N] ended with EOS (not: as long as the longest)
        if cfg.mask_truncated_completions:
            loss_mask &= is_terminated[:, None]
        # 5. the method's per-response quantities, on the micro-batches the updates will use
        seeds = [derived_seed(cfg.seed, "mask", self.rollout_index, k) for k in range(self.method.num_mask_seeds(cfg))]
        buf = Buffer(rollout=rollout, rewards=rewards, advantages=advantages, loss_mask=loss_mask, mask_seeds=seeds,
                     old_logp=[], rollout_index=self.rollout_index, columns=columns)
        with torch.no_grad():
            self.method.prepare(buf, self._micro_batches(rollout.num_responses), current=behaviour_is_current(cfg))
        # buffer metrics (TRL names)
        lengths = rollout.response_mask.sum(-1).float()
        seen = (rollout.prompt_mask.sum() + rollout.response_mask.sum()).to(self.accelerator.device, torch.float64)
        self.num_tokens += int(self.accelerator.reduce(seen, reduction="sum") if self.world > 1 else seen)
        m: dict[str, float] = {
            **reward_metrics(first_total, first_valid, G, scorable=first_scorable, accelerator=self.accelerator,
                             world=self.world),  # TRL's batch statistics, over the samples that were scored
            **length_metrics(lengths, is_terminated),
            "num_tokens": float(self.num_tokens),  # TRL: prompt + completion tokens seen so far, all processes
            "perf/rollout_time": stats["sample_time"],
            "perf/reward_time": stats["reward_time"],
            "perf/buffer_time": time.perf_counter() - t_sampled,
        }
        if self.family.response_unit == "images":
            m["perf/images_per_s"] = rollout.num_responses / max(stats["sample_time"], 1e-9)
        else:
            m["perf/tokens_per_s"] = float(rollout.response_mask.sum()) / max(stats["sample_time"], 1e-9)
        if cfg.dynamic_sampling:
            m["dynamic_sampling/rollout_batches"] = tries
            m["dynamic_sampling/sampled_responses"] = float(stats["sampled"])  # this process's, all tries (the cost)
            m["dynamic_sampling/frac_zero_std_groups"] = stats["zero_std_groups"] / max(1, stats["groups_seen"])
        if stats["dropped_groups"]:
            m["rewards/dropped_groups"] = stats["dropped_groups"]
        if cfg.on_reward_error == "drop":
            m["rewards/dropped"] = float(stats["dropped"])  # samples, all tries of this rollout batch
        m.update(per_reward_metrics(per_reward_seen))
        for k, v in reward_logs.items():
            finite = [x for x in v if math.isfinite(x)]
            m[k] = sum(finite) / len(finite) if finite else float("nan")
        buf.metrics.update(m)
        return buf

    def _advantages(self, rewards: torch.Tensor, scorable: torch.Tensor) -> torch.Tensor:
        return compute_advantages(rewards, scorable, self.cfg, self.accelerator, self.world)

    def _micro_batches(self, n: int) -> list[torch.Tensor]:
        b = self.cfg.per_device_train_batch_size
        return [torch.arange(s, min(s + b, n)) for s in range(0, n, b)]

    # ============================================================================== 6: one optimizer step

    def _optimizer_step(self, buf: Buffer, inner: int, part: int = 0) -> dict[str, float]:
        """One optimizer step over slice `part` of the buffer (its gradient_accumulation_steps micro-batches; the
        whole buffer unless steps_per_generation holds more), in pass `inner`."""
        cfg, acc = self.cfg, self.accelerator
        model = self.policy.model
        mbs = self._micro_batches(buf.rollout.num_responses)
        if cfg.steps_per_pass > 1:
            ga = cfg.gradient_accumulation_steps
            mbs = mbs[part * ga : (part + 1) * ga]
        rows = torch.cat(mbs)  # [n] the rows of this step
        N = int(rows.numel())
        mask = buf.loss_mask[rows.to(buf.loss_mask.device)]
        # global normalisers (all processes, all micro-batches) so that the accumulated, DDP-averaged gradient
        # equals the gradient of the loss over the whole global batch
        totals = torch.tensor([float(mask.sum()), float(N), float(N // cfg.num_generations)], device=acc.device)
        if self.world > 1:
            totals = acc.reduce(totals, reduction="sum")
        g_tokens, g_seqs, g_groups = (float(x) for x in totals)
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for j, idx in enumerate(mbs):
            sync = j == len(mbs) - 1
            ctx = acc.no_sync(model) if (not sync and self.world > 1) else nullcontext()
            # gradient checkpointing recomputes activations only in the gradient forwards (mmrl.training.grad_checkpointing)
            with ctx, (grad_checkpointing.active(model) if cfg.gradient_checkpointing else nullcontext()):
                out = self.method.loss(buf, MicroBatch(idx, inner, j, self.step, self.rank, g_tokens, g_seqs, g_groups))
                loss, m = out.loss, out.metrics
                buf.store(idx, out)
                loss_total += float(loss.detach())
                acc.backward(loss * self.world)  # DDP averages over processes; the normalisers are global
            for k, v in m.items():
                w = float(len(idx))
                sums[k] = sums.get(k, 0.0) + float(v) * w
                counts[k] = counts.get(k, 0.0) + w
        metrics = {k: sums[k] / counts[k] for k in sums}
        metrics.update(clip_extremes(metrics, self.accelerator, self.world))
        if buf.token_stats:  # statistics the gradient forward took for the buffer (one step per rollout)
            buf.metrics.update(self.method.token_stat_metrics(buf, buf.token_stats))
            buf.token_stats = {}
        fault_point("in_optimizer_step", self.step + 1)
        # clip, check, step
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        params = [p for p in model.parameters() if p.requires_grad]
        before = snapshot(params) if cfg.log_diagnostics and logged_step(cfg, self.step + 1) else None  # update_ratio
        grad_norm = acc.clip_grad_norm_(params, max_norm)
        grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        finite = math.isfinite(loss_total) and math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            self.nonfinite_in_a_row = 0
        else:
            self.nonfinite_in_a_row += 1
            metrics["train/skipped_nonfinite"] = 1.0
            warnings.warn(f"step {self.step + 1}: non-finite loss ({loss_total}) or gradient norm ({grad_norm}); step "
                          f"skipped ({self.nonfinite_in_a_row} in a row, the run stops at {cfg.max_nonfinite_steps})",
                          RuntimeWarning, stacklevel=2)
            if self.nonfinite_in_a_row >= cfg.max_nonfinite_steps:
                raise TrainingError(
                    f"{self.nonfinite_in_a_row} optimizer steps in a row had a non-finite loss or gradient (last: loss "
                    f"{loss_total}, grad norm {grad_norm}); stopping. Lower learning_rate or check the rewards; the last "
                    f"checkpoint is intact."
                )
        finish_step_metrics(metrics, before, params)  # diag/: step totals to ratios, the update size
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped (non-finite) step still advances the schedule; torch warns about it
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        metrics["loss"] = loss_total
        metrics["grad_norm"] = grad_norm
        return metrics

    def _maybe_sync_reference(self) -> None:
        """TRL's `sync_ref_model` (TR-DPO): every ref_model_sync_steps steps, ref <- alpha * policy + (1 - alpha) * ref."""
        cfg = self.cfg
        if not cfg.sync_ref_model or self.step % cfg.ref_model_sync_steps or self.policy.ref_model is None:
            return
        mix_into_reference(self.policy.ref_model, self.accelerator.unwrap_model(self.policy.model), cfg.ref_model_mixup_alpha)

    # =================================================================================== 7: save / resume

    def save(self) -> Path | None:
        """Write a checkpoint of the current step (main process; the others wait)."""
        acc = self.accelerator
        acc.wait_for_everyone()
        self._full_state = gather_full_state_dict(acc, self.policy.model)  # FSDP / ZeRO-3: every process takes part
        state = buffer = None
        if self.is_main:
            positions = [self.stream.position]
            state = {"step": self.step, "rollout_index": self.rollout_index, "positions": positions,
                     "nonfinite_in_a_row": self.nonfinite_in_a_row, "config": self.cfg.to_dict(), "world": self.world,
                     "num_tokens": self.num_tokens, "dataset_sha256": self._dataset_sha256}
            buffer = self.buffer.to_state() if self.buffer is not None else None
        # every process writes its RNG states (and its optimizer shard when sharded); the main process the rest
        path = save_checkpoint(
            self.run_dir, self.step, save_model=self._save_model, optimizer=self.optimizer, scheduler=self.scheduler,
            buffer=buffer, state=state, keep=self.cfg.save_total_limit, ranks=Ranks(self.rank, self.world),
            sharded=optimizer_is_sharded(acc, self.optimizer))
        acc.wait_for_everyone()
        return path

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        """TRL's `Trainer.save_model`: the current model into `output_dir` (default: the run's), loadable by
        `from_pretrained(output_dir)`, with a short model card (`mmrl.checkpointing.final_model`). Every process
        calls it (sharded weights are gathered); the main process writes."""
        acc = self.accelerator
        out = Path(output_dir) if output_dir is not None else self.run_dir
        acc.wait_for_everyone()
        full = gather_full_state_dict(acc, self.policy.model)
        if self.is_main:
            from mmrl.checkpointing.final_model import write_final_model

            self._final_files = write_final_model(self.policy, out, base_model=self.cfg.model_name_or_path,
                                                  config=self.cfg.to_dict(), reward_names=self.rewards.names, full_state=full)
        acc.wait_for_everyone()
        return out

    def push_to_hub(self) -> str | None:
        """Upload the final model written by `save_model` to `hub_model_id` (main process); returns the repository."""
        if not self.is_main:
            return None
        from mmrl.checkpointing.final_model import push_final_model

        files = getattr(self, "_final_files", None) or []
        if not files:
            self.save_model()
            files = self._final_files
        return push_final_model(self.run_dir, files, hub_model_id=self.cfg.hub_model_id, private=self.cfg.hub_private_repo)

    def _save_model(self, path: Path) -> None:
        full, self._full_state = getattr(self, "_full_state", None), None
        save_model_dir(self.policy, path, self.cfg.model_name_or_path, full)

    def _maybe_resume(self) -> bool:
        warn = lambda m: warnings.warn(m, RuntimeWarning, stacklevel=5)  # noqa: E731
        load = partial(load_checkpoint, rank=self.rank, world=self.world,
                       sharded=optimizer_is_sharded(self.accelerator, self.optimizer), warn=warn)
        try:
            return resume_run(self.run_dir, self.cfg.resume_from, self._restore, self.accelerator, self.is_main, load=load)
        except CheckpointIncompatible as e:
            raise TrainingError(str(e)) from None

    def _restore(self, path: Path, ck: dict) -> None:
        """Put a loaded checkpoint `ck` (`mmrl.checkpointing.checkpoint.load_checkpoint`) back: the settings that win
        on resume (`apply_resume_settings`), weights, optimizer, scheduler, RNG, counters, the prompt stream's
        position and the rollout buffer."""
        st = ck["state"]
        if st.get("world", 1) != self.world:
            raise TrainingError(f"checkpoint {path} was written by {st.get('world')} processes; this run has {self.world}")
        self.cfg = apply_resume_settings(self.cfg, st.get("config") or {}, path)
        load_model_weights(self.policy.unwrapped, path / "model")
        if ck["optimizer_sharded"]:  # this process's shard
            shard = optimizer_shard_file(self.rank)
            try:
                load_optimizer_shard(self.optimizer, ck["optimizer"], f"checkpoint {path}: {shard}")
            except (ValueError, KeyError, TypeError) as e:
                raise CheckpointDamaged(f"checkpoint {path}: {shard} does not fit this run ({e})") from e
        else:
            self.optimizer.load_state_dict(ck["optimizer"])
        self.scheduler.load_state_dict(ck["scheduler"])
        if set(ck["rng"]) == {"torch"}:  # an older mmrl's checkpoint (load_checkpoint warned)
            torch.set_rng_state(ck["rng"]["torch"])
        else:
            restore_rng(ck["rng"], warn=lambda m: warnings.warn(m, RuntimeWarning, stacklevel=2))
        self.step, self.rollout_index = int(st["step"]), int(st["rollout_index"])
        self.nonfinite_in_a_row, self.num_tokens = int(st.get("nonfinite_in_a_row", 0)), int(st.get("num_tokens", 0))
        self.stream.position = int(st["positions"][0])
        self.buffer = Buffer.from_state(ck["buffer"]) if ck["buffer"] is not None else None
        if self.buffer is not None:
            self.buffer.rollout = self.buffer.rollout.to(self.accelerator.device)

    # ========================================================================================= pictures

    def _write_credit_pictures(self, buf: Buffer) -> None:
        from mmrl.reporting.credit_viz import write_credit_pictures

        if buf.credit is None:
            return
        write_credit_pictures(self.run_dir / "credit", self.step, self.policy, buf.rollout, buf.credit, buf.rewards)


# ===================================================================================================== helpers

def train(cfg: TrainConfig, **kwargs) -> dict[str, Any]:
    """Build a `Trainer` for `cfg` and run it; returns the last step's metrics."""
    return Trainer(cfg, **kwargs).train()
