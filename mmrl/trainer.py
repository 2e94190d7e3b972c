"""The one RL training loop of mmrl: every method on every model family (DESIGN.md, "The loop").

    for step in range(max_steps):
        if the buffer is stale (every num_iterations steps):
            1. draw a batch of prompts                      (each process its own share)
            2. sample G responses each                      policy.sample
            3. score them with the rewards                  RewardSet (weighted sum, per-reward metrics)
            4. group advantages                             group_advantages   (DMPO: importance weights)
            5. behaviour / reference log-probs, token credit (DGPO at buffer time; GCPO per micro-batch)
        6. one optimizer step over the buffer, micro-batched with gradient accumulation
        7. log metrics (TRL names), checkpoint, token-credit pictures

Model differences live in the adapters (`mmrl.models`), method differences in the pure functions of
`mmrl.algorithms`; this file only wires them. Every random stream is derived from (seed, what, index), so a
resumed run continues exactly like an uninterrupted one. accelerate owns devices and distribution.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import threading
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mmrl import grad_checkpointing
from mmrl.algorithms import (
    aggregate,
    dgpo_token_weights,
    dmpo_baseline,
    dmpo_weights,
    effective_sample_size,
    gcpo_token_weights,
    gcpo_weights_from_scores,
    group_advantages,
    policy_loss,
    wdce_loss,
    wddo_loss,
)
from mmrl.algorithms.groups import group_softmax
from mmrl.buffer import Buffer, concat_rollouts
from mmrl.checkpoint import latest_checkpoint, load_checkpoint, load_model_weights, remove_stale, save_checkpoint
from mmrl.completion_stats import length_metrics, terminated
from mmrl.completions_log import completion_rows, with_advantages
from mmrl.config import TrainConfig
from mmrl.data.loading import require_column
from mmrl.epochs import resolve_max_steps
from mmrl.faults import fault_point
from mmrl.metrics_log import MetricLogger
from mmrl.models.base import is_peft_model
from mmrl.policy_factory import apply_lora, build_policy, check_model_source, estimator_options, generation_options, needs_reference, set_generation_defaults
from mmrl.protocol import NoisedBatch, Rollout
from mmrl.reward_inputs import make_trainer_state, reward_arguments


class TrainingError(RuntimeError):
    """The run cannot continue (e.g. repeated non-finite steps, dynamic sampling cannot fill a batch)."""


class TrainingStopped(KeyboardInterrupt):
    """SIGTERM or Ctrl-C (SIGINT) stopped the run at the end of a step, after writing a checkpoint of that step."""

    def __init__(self, message: str, signum: int, checkpoint: Path | None):
        super().__init__(message)
        self.signum, self.checkpoint = signum, checkpoint


def derived_seed(*parts: Any) -> int:
    """A 62-bit seed from a tuple (seed, purpose, index...): independent streams that survive a restart."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


class PromptStream:
    """Prompts in a seeded order, reshuffled every epoch; process p of P reads global indices p, p+P, p+2P, ...

    `position` counts the prompts this process has consumed, so the stream is resumable. With one process of
    batch 2B or two processes of batch B the same global prompts are used.
    """

    def __init__(self, rows: Sequence[dict], seed: int, rank: int = 0, world: int = 1, position: int = 0):
        if len(rows) == 0:
            raise ValueError("the prompt dataset is empty")
        self.rows, self.seed, self.rank, self.world, self.position = list(rows), seed, rank, world, position
        self._perm_epoch, self._perm = -1, None

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(derived_seed(self.seed, "data", epoch))
            self._perm, self._perm_epoch = torch.randperm(len(self.rows), generator=g), epoch
        return self._perm

    def take(self, k: int) -> list[tuple[int, dict]]:
        """The next k (global index, row) pairs of this process."""
        out = []
        for _ in range(k):
            g = self.rank + self.position * self.world
            epoch, i = divmod(g, len(self.rows))
            out.append((g, self.rows[int(self._order(epoch)[i])]))
            self.position += 1
        return out


class Trainer:
    """Runs `cfg` (see `mmrl.config.TrainConfig`).

    Args:
        cfg: the configuration (validated here, before any model is loaded).
        policy: an adapter to train instead of building one from `cfg` (Python API).
        dataset: rows `{"prompt": ..., <columns passed to the rewards>}` instead of `cfg.task`'s training split.
        reward_funcs: reward names or callables `fn(prompts, completions, **kwargs) -> list[float | None]` instead
            of `cfg.reward_funcs` / the task's defaults (TRL reward functions work unchanged).
        eval_dataset, eval_metric: test rows and the reward whose mean is the accuracy, for `eval_steps` (default:
            the task's test split and metric).
    """

    def __init__(self, cfg: TrainConfig, *, policy=None, dataset: Sequence[dict] | None = None,
                 reward_funcs: Sequence[str | Callable] | None = None, eval_dataset: Sequence[dict] | None = None,
                 eval_metric: str | None = None):
        cfg.validate()
        self.cfg = cfg
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        ddp = DistributedDataParallelKwargs(find_unused_parameters=cfg.family in ("janus", "vlm"))
        # accelerate only picks gloo (MULTI_CPU) when told to use the CPU; a torchrun-style multi-process launch on a
        # machine without an accelerator would otherwise give N independent single-process runs
        cpu_ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
        self.accelerator = Accelerator(mixed_precision=cfg.mixed_precision, kwargs_handlers=[ddp], cpu=cpu_ddp)
        self.is_main = self.accelerator.is_main_process
        self.run_dir = Path(cfg.output_dir)
        if not cfg.resume_from and (found := latest_checkpoint(self.run_dir)) is not None:
            # a fresh run here would rotate out its own new checkpoints (older step numbers) and reset metrics.jsonl
            raise TrainingError(f"output_dir {str(self.run_dir)!r} already holds checkpoints of a run (latest: {found.name}); "
                                "resume it with resume_from=auto, or choose a new output_dir")
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        # data and rewards before the model: a bad model path, task, dataset or reward fails fast
        if policy is None:
            check_model_source(cfg)
        if dataset is None:
            from mmrl.data.tasks import load_task

            task = load_task(cfg.task, cfg.dataset_path, seed=cfg.seed, eval_split=cfg.eval_split)
            dataset = task.train
            reward_funcs = reward_funcs or cfg.reward_funcs or task.reward_funcs
            eval_dataset = task.test if eval_dataset is None else eval_dataset
            eval_metric = eval_metric or task.metric
        self.eval_dataset = list(eval_dataset or [])[: cfg.eval_limit] if cfg.eval_limit else list(eval_dataset or [])
        self.eval_metric = eval_metric
        if cfg.eval_steps and (not self.eval_dataset or not self.eval_metric):
            raise ValueError("eval_steps > 0 needs test rows and a metric (a task, or eval_dataset= and eval_metric=)")
        from mmrl.rewards.combine import RewardSet

        self.rewards = RewardSet(list(reward_funcs or cfg.reward_funcs), weights=cfg.reward_weights,
                                 on_error=cfg.on_reward_error, timeout=cfg.reward_timeout, retries=cfg.reward_retries,
                                 retry_backoff=cfg.reward_retry_backoff, **cfg.reward_kwargs)
        self.dataset = list(dataset)
        require_column(self.dataset, "prompt", "the training dataset" if cfg.dataset_path is None else cfg.dataset_path)
        cfg.max_steps = resolve_max_steps(cfg, len(self.dataset), self.accelerator.num_processes)  # TRL's num_train_epochs
        self.policy = policy if policy is not None else build_policy(cfg, device=self.accelerator.device)
        set_generation_defaults(self.policy, generation_options(cfg))  # the config's sampling options, also for a given policy
        if cfg.use_peft and not is_peft_model(self.policy.model):
            self.policy.model = apply_lora(self.policy.model, cfg)
        if cfg.gradient_checkpointing:
            grad_checkpointing.enable(self.policy.model)
        self.policy.model.eval()  # dropout off (ratio exactly 1 at the first inner step)
        if policy is not None and needs_reference(cfg) and not self.policy.has_reference:
            import copy

            self.policy.ref_model = copy.deepcopy(self.policy.unwrapped).requires_grad_(False).eval()
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                           eps=cfg.adam_epsilon, weight_decay=cfg.weight_decay)
        from transformers import get_scheduler

        self.scheduler = get_scheduler(cfg.lr_scheduler_type, self.optimizer, num_warmup_steps=int(cfg.warmup_ratio * cfg.max_steps),
                                       num_training_steps=cfg.max_steps)
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
        self._stop_signal: int | None = None

    # ================================================================================================ the loop

    def train(self) -> dict[str, Any]:
        """Train for `max_steps` optimizer steps (resuming if asked); returns the last step's metrics."""
        cfg = self.cfg
        resumed = self._maybe_resume()
        logger = MetricLogger(self.run_dir, cfg.report_to, config=cfg.to_dict(), resume_step=self.step if resumed else None, enabled=self.is_main)
        bar = None
        if self.is_main and cfg.progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.max_steps, initial=self.step, desc=f"{cfg.method} on {cfg.family}", unit="step", dynamic_ncols=True)
        last: dict[str, Any] = {}
        old_handlers = self._install_signal_handlers()
        try:
            while self.step < cfg.max_steps:
                t_step = time.perf_counter()
                if self.buffer is None or self.step % cfg.num_iterations == 0:
                    self.buffer = self._collect()  # steps 1-5
                    self.rollout_index += 1
                inner = self.step % cfg.num_iterations
                metrics = self._optimizer_step(self.buffer, inner)  # step 6
                self.step += 1
                metrics.update(self.buffer.metrics)
                metrics["perf/step_time"] = time.perf_counter() - t_step
                metrics["perf/peak_mem_gb"] = _peak_memory_gb(self.accelerator.device)
                metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
                metrics["epoch"] = self.stream.position * self.world / len(self.dataset)
                last = metrics
                if cfg.eval_steps and (self.step % cfg.eval_steps == 0 or self.step == cfg.max_steps):
                    metrics.update(self.evaluate())
                if self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps:  # step 7
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
                    saved = self.save()
                _fault_injection("after_step", self.step)
                signum = self._stop_requested()
                if signum and self.step < cfg.max_steps:
                    path = saved or self.save()
                    name = signal.Signals(signum).name
                    raise TrainingStopped(f"stopped by {name} after step {self.step}; checkpoint written to {path}; "
                                          "resume with resume_from=auto", signum, path)
        finally:
            self._restore_signal_handlers(old_handlers)
            if bar is not None:
                bar.close()
            logger.close()
        return last

    def evaluate(self) -> dict[str, float]:
        """Accuracy on the evaluation rows (each process scores its share; the mean is over all of them)."""
        from mmrl.evaluate import d1_generation, evaluate

        cfg = self.cfg
        gen = dict(cfg.eval_generation) or d1_generation(cfg.family, cfg.max_completion_length, cfg.block_length, None)
        known = getattr(self.policy, "generation_defaults", {})
        gen = {k: v for k, v in gen.items() if k in known}
        rows = self.eval_dataset[self.rank :: self.world]
        t0 = time.perf_counter()
        res = evaluate(self.policy, rows, self.eval_metric, batch_size=max(16, cfg.per_device_train_batch_size), progress=False,
                       seed=cfg.seed, **gen)
        total = torch.tensor([res.accuracy * max(1, len(rows)), float(len(rows))], device=self.accelerator.device)
        if self.world > 1:
            total = self.accelerator.reduce(total, reduction="sum")
        return {"eval/accuracy": float(total[0] / total[1].clamp(min=1)), "perf/eval_time": time.perf_counter() - t0}

    # ======================================================================================= 1-5: the buffer

    def _collect(self) -> Buffer:
        """Draw prompts, sample, score, and compute every per-response quantity the updates need."""
        cfg, policy = self.cfg, self.policy
        G = cfg.num_generations
        need = cfg.prompts_per_rollout
        t0 = time.perf_counter()
        kept: list[Rollout] = []
        kept_rewards: list[torch.Tensor] = []
        table: list[dict] = []  # log_completions: one row per kept response
        reward_logs: dict[str, list[float]] = {}
        stats = {"dropped_groups": 0, "zero_std_groups": 0, "groups_seen": 0, "sample_time": 0.0, "reward_time": 0.0}
        tries = 0
        while sum(r.num_groups for r in kept) < need:
            tries += 1
            if tries > cfg.dynamic_sampling_max_tries:
                raise TrainingError(
                    f"{'dynamic sampling' if cfg.dynamic_sampling else 'refilling dropped groups'} could not fill a batch: after {tries - 1} rollout batches only "
                    f"{sum(r.num_groups for r in kept)} of {need} groups were usable ({stats['zero_std_groups']} of "
                    f"{stats['groups_seen']} groups had equal rewards, {stats['dropped_groups']} were dropped for failed "
                    f"rewards). Raise "
                    f"dynamic_sampling_max_tries (now {cfg.dynamic_sampling_max_tries}), make the task easier or harder, "
                    f"or set dynamic_sampling=false. The last checkpoint is intact."
                )
            todo = need - sum(r.num_groups for r in kept)
            draw = need if tries == 1 else max(todo, 1)
            items = self.stream.take(draw)
            rows = [row for _, row in items]
            seeds = [derived_seed(cfg.seed, "sample", g, j) for g, _ in items for j in range(G)]
            ts = time.perf_counter()
            rollout = policy.sample([row["prompt"] for row in rows], G, seeds=seeds)
            _fault_injection("during_rollout", self.step + 1)
            stats["sample_time"] += time.perf_counter() - ts
            ts = time.perf_counter()
            state = make_trainer_state(self.step, cfg.max_steps, self.stream.position * self.world / len(self.dataset))
            r_prompts, r_completions, r_columns = reward_arguments(rollout, rows, G, trainer_state=state)  # TRL's arguments
            out = self.rewards(r_prompts, r_completions, **r_columns)
            stats["reward_time"] += time.perf_counter() - ts
            total = out.total.to(torch.float32)  # [N]
            if cfg.overlong_penalty and cfg.family in ("causal_lm", "vlm", "masked_diffusion"):
                pen = _soft_overlong_penalty(rollout.response_mask.sum(-1).cpu(), cfg.max_completion_length, cfg.overlong_buffer_len)
                total = total + pen
                reward_logs.setdefault("rewards/overlong/mean", []).append(float(pen.mean()))
            for name, val in out.metrics.items():
                reward_logs.setdefault(name, []).append(float(val))
            valid = out.valid.view(-1, G).all(-1)  # [B] groups whose rewards are all usable
            stats["dropped_groups"] += int((~valid).sum())
            std = total.view(-1, G).std(-1)  # [B]
            zero = std == 0
            stats["groups_seen"] += int(valid.numel())
            stats["zero_std_groups"] += int((zero & valid).sum())
            keep = valid & ~zero if cfg.dynamic_sampling else valid
            if tries == 1:
                first_total, first_valid = total, valid  # TRL's reward metrics describe the sampled batch
            keep_rows = keep.repeat_interleave(G)
            if keep_rows.any():
                idx = torch.nonzero(keep_rows).flatten()
                kept.append(rollout.select(idx))
                kept_rewards.append(total[idx.to(total.device)])
                if cfg.log_completions:
                    table += completion_rows(r_prompts, r_completions, out.per_reward, idx.tolist())
        rollout = concat_rollouts(kept)
        rewards = torch.cat(kept_rewards)
        if rollout.num_groups > need:  # refills may overshoot: keep whole groups only
            rollout = rollout.select(torch.arange(need * G))
            rewards = rewards[: need * G]
        t_sampled = time.perf_counter()
        # 4. advantages (DMPO keeps them for logging only: its update is weight-based)
        advantages = self._advantages(rewards.to(self.accelerator.device))
        if cfg.log_completions:
            self._completions_table = with_advantages(table[: rollout.num_responses], advantages, rewards)
        loss_mask = rollout.response_mask.clone()
        is_terminated = terminated(rollout).to(loss_mask.device)  # [N] ended with EOS (not: as long as the longest)
        if cfg.mask_truncated_completions:
            loss_mask &= is_terminated[:, None]
        # 5. behaviour / reference log-probs and token credit, on the micro-batches the updates will use
        seeds = [derived_seed(cfg.seed, "mask", self.rollout_index, k) for k in range(cfg.num_iterations if cfg.random_masking else 1)]
        if cfg.method == "dmpo":
            seeds = seeds[:1]
        buf = Buffer(rollout=rollout, rewards=rewards, advantages=advantages, loss_mask=loss_mask, mask_seeds=seeds,
                     old_logp=[], rollout_index=self.rollout_index)
        with torch.no_grad():
            if cfg.method == "dmpo":
                self._dmpo_buffer(buf)
            else:
                self._old_logprobs(buf)
        # buffer metrics (TRL names)
        lengths = rollout.response_mask.sum(-1).float()
        seen = (rollout.prompt_mask.sum() + rollout.response_mask.sum()).to(self.accelerator.device, torch.float64)
        self.num_tokens += int(self.accelerator.reduce(seen, reduction="sum") if self.world > 1 else seen)
        m: dict[str, float] = {
            "reward": float(first_total.mean()),
            "reward_std": float(first_total.view(-1, G).std(-1).mean()),
            "frac_reward_zero_std": float((first_total.view(-1, G).std(-1) == 0).float().mean()),
            **length_metrics(lengths, is_terminated),
            "num_tokens": float(self.num_tokens),  # TRL: prompt + completion tokens seen so far, all processes
            "perf/rollout_time": stats["sample_time"],
            "perf/reward_time": stats["reward_time"],
            "perf/buffer_time": time.perf_counter() - t_sampled,
        }
        if cfg.family == "janus":
            m["perf/images_per_s"] = rollout.num_responses / max(stats["sample_time"], 1e-9)
        else:
            m["perf/tokens_per_s"] = float(rollout.response_mask.sum()) / max(stats["sample_time"], 1e-9)
        if cfg.dynamic_sampling:
            m["dynamic_sampling/rollout_batches"] = tries
            m["dynamic_sampling/frac_zero_std_groups"] = stats["zero_std_groups"] / max(1, stats["groups_seen"])
        if stats["dropped_groups"]:
            m["rewards/dropped_groups"] = stats["dropped_groups"]
        for k, v in reward_logs.items():
            m[k] = sum(v) / len(v)
        buf.metrics.update(m)
        return buf

    def _advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if cfg.scale_rewards == "batch" and self.world > 1:
            # std over the global batch: gather every process's rewards
            all_r = self.accelerator.gather(rewards)
            centered = group_advantages(rewards, cfg.num_generations, scale="none")
            return centered / (all_r.std() + 1e-6)
        return group_advantages(rewards, cfg.num_generations, scale=cfg.scale_rewards)

    def _micro_batches(self, n: int) -> list[torch.Tensor]:
        b = self.cfg.per_device_train_batch_size
        return [torch.arange(s, min(s + b, n)) for s in range(0, n, b)]

    def _old_logprobs(self, buf: Buffer) -> None:
        """Behaviour log-probs (and reference log-probs, DGPO statistics) per mask seed and micro-batch.

        With one optimizer step per rollout (`behaviour_is_current`) the behaviour policy is the policy being
        updated: its log-probs, entropy and DGPO statistics come from the gradient forward itself, so only the
        reference log-probs of a KL term are computed here (DGPO's reference pass in the update gives those too)."""
        cfg, policy = self.cfg, self.policy
        N, T = buf.rollout.response_ids.shape
        dev = buf.rollout.response_ids.device
        want_dgpo = cfg.method == "dgpo"
        if behaviour_is_current(cfg):
            if cfg.beta > 0 and not want_dgpo:
                est = estimator_options(cfg, buf.mask_seeds[0])
                ref = torch.zeros(N, T, device=dev)
                for idx in self._micro_batches(N):
                    ref[idx] = policy.logprob(buf.rollout.select(idx), use_reference=True, **est).logp
                buf.ref_logp = [ref]
            return
        entropies, h2s = torch.zeros(N, T, device=dev), torch.zeros(N, T, device=dev)
        buf.ref_logp = [] if cfg.beta > 0 else None
        for k, seed in enumerate(buf.mask_seeds):
            old = torch.zeros(N, T, device=dev)
            ref = torch.zeros(N, T, device=dev) if cfg.beta > 0 else None
            est = estimator_options(cfg, seed)
            for idx in self._micro_batches(N):
                mb = buf.rollout.select(idx)
                if want_dgpo and k == 0:
                    s = policy.logprob(mb, stats=("h2", "entropy"), stats_against="reference", **est)
                    h2s[idx], entropies[idx] = s.stats["h2"], s.stats["entropy"]
                    if ref is not None:
                        ref[idx] = s.other_logp
                else:
                    s = policy.logprob(mb, stats=("entropy",) if k == 0 else (), **est)
                    if k == 0:
                        entropies[idx] = s.stats["entropy"]
                    if ref is not None:
                        ref[idx] = policy.logprob(mb, use_reference=True, **est).logp
                old[idx] = s.logp
            buf.old_logp.append(old)
            if ref is not None:
                buf.ref_logp.append(ref)
        if want_dgpo:
            buf.token_weights = dgpo_token_weights(h2s, entropies, buf.loss_mask, vocab_size=policy.vocab_size, tau=cfg.dgpo_tau,
                                                   kappa=cfg.dgpo_kappa)
        _token_metrics(buf, entropies, h2s if want_dgpo else None)

    def _dmpo_buffer(self, buf: Buffer) -> None:
        """DMPO eq. 10: ELBO (or exact) log p_ref - log p_v with shared masks, importance weights, baseline.

        With `dmpo_target=behaviour` (App. B.2's proximal limit) the log-ratio term is 0 and no likelihood is
        estimated unless the model baseline or WDDO needs log p_v."""
        cfg, policy = self.cfg, self.policy
        N = buf.rollout.num_responses
        dev = buf.rewards.device
        need_v = cfg.dmpo_target == "reference" or cfg.dmpo_loss == "wddo" or cfg.dmpo_baseline == "model"
        est = estimator_options(cfg, buf.mask_seeds[0], kind="elbo")
        elbo_v, elbo_ref = torch.zeros(N, device=dev), torch.zeros(N, device=dev)
        for idx in self._micro_batches(N) if need_v else []:
            mb = buf.rollout.select(idx)
            elbo_v[idx] = policy.logprob(mb, **est).logp.sum(-1).to(dev)
            if cfg.dmpo_target == "reference":
                elbo_ref[idx] = policy.logprob(mb, use_reference=True, **est).logp.sum(-1).to(dev)
        log_ratio = elbo_ref - elbo_v if cfg.dmpo_target == "reference" else torch.zeros(N, device=dev)  # [N]
        G = cfg.num_generations
        buf.dmpo_w = dmpo_weights(buf.rewards, log_ratio, G, alpha=cfg.dmpo_alpha, coeff=cfg.dmpo_coeff)
        if cfg.dmpo_loss == "wdce" and cfg.dmpo_baseline != "model":
            buf.dmpo_w_base = dmpo_baseline(cfg.dmpo_baseline, rewards=buf.rewards, log_ref_minus_v=log_ratio, group_size=G,
                                            alpha=cfg.dmpo_alpha, coeff=cfg.dmpo_coeff)
        buf.dmpo_elbo_v = elbo_v
        buf.old_logp = [torch.zeros_like(buf.loss_mask, dtype=torch.float32)]  # unused by DMPO
        ess = effective_sample_size(buf.dmpo_w, G)
        buf.metrics.update({"dmpo/ess": float(ess.mean()), "dmpo/weight_max": float(buf.dmpo_w.max())})
        if cfg.dmpo_target == "reference":
            buf.metrics.update({"dmpo/log_ref_minus_v_mean": float(log_ratio.mean()),
                                "dmpo/log_ref_minus_v_std": float(log_ratio.std()) if N > 1 else 0.0})

    # ============================================================================== 6: one optimizer step

    def _optimizer_step(self, buf: Buffer, inner: int) -> dict[str, float]:
        cfg, acc = self.cfg, self.accelerator
        model = self.policy.model
        N = buf.rollout.num_responses
        mbs = self._micro_batches(N)
        mask = buf.loss_mask
        # global normalisers (all processes, all micro-batches) so that the accumulated, DDP-averaged gradient
        # equals the gradient of the loss over the whole global batch
        totals = torch.tensor([float(mask.sum()), float(N), float(N // cfg.num_generations)], device=acc.device)
        if self.world > 1:
            totals = acc.reduce(totals, reduction="sum")
        g_tokens, g_seqs, g_groups = (float(x) for x in totals)
        seed_k = inner % len(buf.mask_seeds)
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for j, idx in enumerate(mbs):
            sync = j == len(mbs) - 1
            ctx = acc.no_sync(model) if (not sync and self.world > 1) else nullcontext()
            # gradient checkpointing recomputes activations only in the gradient forwards (mmrl.grad_checkpointing)
            with ctx, (grad_checkpointing.active(model) if cfg.gradient_checkpointing else nullcontext()):
                if cfg.method == "dmpo":
                    loss, m = self._dmpo_loss(buf, idx, g_groups, g_seqs, step_in_buffer=inner, micro=j)
                else:
                    loss, m = self._policy_gradient_loss(buf, idx, seed_k, inner, g_tokens, g_seqs)
                loss_total += float(loss.detach())
                acc.backward(loss * self.world)  # DDP averages over processes; the normalisers are global
            for k, v in m.items():
                w = float(len(idx))
                sums[k] = sums.get(k, 0.0) + float(v) * w
                counts[k] = counts.get(k, 0.0) + w
        metrics = {k: sums[k] / counts[k] for k in sums}
        metrics.update(self._clip_extremes(metrics))
        if buf.token_stats:  # statistics the gradient forward took for the buffer (one step per rollout)
            _token_metrics(buf, buf.token_stats["entropy"], buf.token_stats.get("h2"))
            buf.token_stats = {}
        _fault_injection("in_optimizer_step", self.step + 1)
        # clip, check, step
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        grad_norm = acc.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_norm)
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
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped (non-finite) step still advances the schedule; torch warns about it
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        metrics["loss"] = loss_total
        metrics["grad_norm"] = grad_norm
        return metrics

    def _clip_extremes(self, metrics: dict[str, float]) -> dict[str, float]:
        """TRL's `clip_ratio/low_min` and `clip_ratio/high_max`: the lowest low-clip and highest high-clip ratio
        over the processes (each process's ratio is its step mean; one process: equal to the mean)."""
        if "clip_ratio/low_mean" not in metrics:
            return {}
        t = torch.tensor([metrics["clip_ratio/low_mean"], metrics["clip_ratio/high_mean"]], device=self.accelerator.device)
        if self.world > 1:
            every = self.accelerator.gather(t[None])  # [P, 2]
            low, high = float(every[:, 0].min()), float(every[:, 1].max())
        else:
            low, high = float(t[0]), float(t[1])
        return {"clip_ratio/low_min": low, "clip_ratio/high_max": high}

    def _policy_gradient_loss(self, buf: Buffer, idx: torch.Tensor, seed_k: int, inner: int, g_tokens: float, g_seqs: float):
        """GRPO / DAPO / Dr.GRPO / diffu-GRPO / GCPO / DGPO: clipped surrogate with token-level advantages."""
        cfg, policy = self.cfg, self.policy
        mb = buf.rollout.select(idx)
        mask = buf.loss_mask[idx]  # [n, T]
        est = estimator_options(cfg, buf.mask_seeds[seed_k])
        m: dict[str, float] = {}
        want_kl_stats = cfg.gcpo_divergence == "full_kl" and cfg.method == "gcpo"
        # no stored behaviour log-probs: one step per rollout, this forward's detached scores are the behaviour's
        current = not buf.old_logp
        want_dgpo_now = cfg.method == "dgpo" and (cfg.dgpo_policy == "current" or current)
        entropy = ("entropy",) if current else ()  # the buffer's entropy metric, from the same logits
        logp_neg = None
        if cfg.method == "gcpo" and not want_kl_stats:
            # the negative-condition forward runs before the positive one, so its logits are freed before the
            # graph of the gradient forward is built (peak memory stays that of GRPO)
            with torch.no_grad():
                logp_neg = policy.logprob(mb, condition="negative", **est).logp
        if want_kl_stats:
            scores = policy.logprob(mb, stats=("kl", *entropy), stats_against="negative", **est)
        elif want_dgpo_now:
            scores = policy.logprob(mb, stats=("h2", "entropy"), stats_against="reference", **est)
        else:
            scores = policy.logprob(mb, stats=entropy, **est)
        logp = scores.logp  # [n, T]
        if current and inner == 0:
            for k in ("entropy", "h2"):
                if k in scores.stats:
                    if k not in buf.token_stats:
                        buf.token_stats[k] = torch.zeros_like(buf.loss_mask, dtype=torch.float32)
                    buf.token_stats[k][idx] = scores.stats[k].float()
        adv = buf.advantages[idx]  # [n]
        weights = None
        if cfg.method == "gcpo":
            if want_kl_stats:
                weights = gcpo_weights_from_scores(scores.stats["kl"], mask, normalization=cfg.gcpo_normalization,
                                                   top_fraction=cfg.gcpo_top_fraction, target_mass=cfg.gcpo_target_mass)
            else:
                weights = gcpo_token_weights(logp.detach(), logp_neg, mask, divergence=cfg.gcpo_divergence,
                                             normalization=cfg.gcpo_normalization, top_fraction=cfg.gcpo_top_fraction,
                                             target_mass=cfg.gcpo_target_mass)
            m.update(_weight_metrics("gcpo", weights, mask))
        elif cfg.method == "dgpo":
            if want_dgpo_now:
                weights = dgpo_token_weights(scores.stats["h2"], scores.stats["entropy"], mask, vocab_size=policy.vocab_size,
                                             tau=cfg.dgpo_tau, kappa=cfg.dgpo_kappa)
                if current:
                    if buf.token_weights is None:
                        buf.token_weights = torch.zeros_like(buf.loss_mask, dtype=torch.float32)
                    buf.token_weights[idx] = weights.float()
                else:
                    m.update(_weight_metrics("dgpo", weights, mask))
            else:
                weights = buf.token_weights[idx]
        token_adv = adv[:, None] * weights if weights is not None else adv  # [n, T] or [n]
        if inner == 0 and buf.credit is None:
            buf.credit = torch.zeros_like(buf.loss_mask, dtype=torch.float32)
        if inner == 0:
            buf.credit[idx] = (token_adv if token_adv.dim() == 2 else token_adv[:, None].expand_as(mask)).detach().float() * mask
        old = logp.detach() if current else buf.old_logp[seed_k][idx]
        ref = buf.ref_logp[seed_k][idx] if buf.ref_logp else (scores.other_logp if cfg.beta > 0 else None)
        per_token, pm = policy_loss(logp, old, token_adv, mask, eps_low=cfg.epsilon, eps_high=cfg.eps_high,
                                    dual_clip=cfg.dual_clip, ref_logp=ref, beta=cfg.beta)
        n = float(len(idx))
        if cfg.loss_type in ("dapo", "token_mean"):
            loss = aggregate(per_token, mask, "token_mean", num_items=g_tokens)
        elif cfg.loss_type in ("grpo", "seq_mean_token_mean"):
            loss = aggregate(per_token, mask, "seq_mean_token_mean") * n / g_seqs
        else:
            loss = aggregate(per_token, mask, "seq_mean_token_sum_norm", max_len=cfg.max_completion_length) * n / g_seqs
        if cfg.nll_coef:
            loss = loss + cfg.nll_coef * aggregate(-logp, mask, "token_mean", num_items=g_tokens)
        for k, v in pm.items():
            m[k] = float(v)
        with torch.no_grad():
            if inner == 0 and not current:
                dev = (logp.detach() - old).abs()
                m["policy/first_inner_logp_max_diff"] = float(dev[mask].max()) if mask.any() else 0.0
        return loss, m

    def _dmpo_loss(self, buf: Buffer, idx: torch.Tensor, g_groups: float, g_seqs: float, *, step_in_buffer: int, micro: int):
        """DMPO: WDCE (eq. 11) or WDDO on R masked copies of each response (fresh masks every micro-step)."""
        cfg, policy = self.cfg, self.policy
        mb = buf.rollout.select(idx)
        gen = torch.Generator(device="cpu").manual_seed(derived_seed(cfg.seed, "noise", self.step, micro, self.rank))
        noised: NoisedBatch = policy.forward_noise(mb, cfg.dmpo_num_copies, gen)
        lp = policy.denoise_logprob(noised)  # [R, n, T]
        masked_sum = lp.sum(-1)  # [R, n]
        elbo_theta = _sequence_elbo(masked_sum, noised)  # [R', n]
        m: dict[str, float] = {}
        G = cfg.num_generations
        if cfg.dmpo_loss == "wdce":
            w = buf.dmpo_w[idx]
            if cfg.dmpo_baseline == "model":
                log_theta_minus_v = elbo_theta.detach().mean(0) - buf.dmpo_elbo_v[idx]
                w_base = group_softmax(log_theta_minus_v, G)
            else:
                w_base = buf.dmpo_w_base[idx]
            w_real = w - cfg.dmpo_baseline_strength * w_base
            loss = wdce_loss(-masked_sum, noised.n_masked, w_real, num_groups=int(g_groups))
            m["dmpo/w_real_pos_sum"] = float(w_real.clamp(min=0).sum() / max(1.0, len(idx) / G))
            if buf.credit is None:
                buf.credit = torch.zeros_like(buf.loss_mask, dtype=torch.float32)
            buf.credit[idx] = w_real.detach().float()[:, None] * buf.loss_mask[idx]
        else:
            R = elbo_theta.shape[0]
            half = max(1, R // 2)
            delta_real = elbo_theta[:half].mean(0) - buf.dmpo_elbo_v[idx]
            delta_fake = (elbo_theta[half:] if R > 1 else elbo_theta).mean(0) - buf.dmpo_elbo_v[idx]
            loss = wddo_loss(delta_real, delta_fake, buf.dmpo_w[idx], beta=cfg.wddo_beta, alpha_ddo=cfg.wddo_alpha) * len(idx) / g_seqs
            m["dmpo/delta_mean"] = float(delta_real.detach().mean())
        m["dmpo/masked_ce"] = float((-masked_sum.detach() / noised.n_masked.clamp(min=1)).mean())
        return loss, m

    # =================================================================================== 7: save / resume

    def save(self) -> Path | None:
        """Write a checkpoint of the current step (main process; the others wait)."""
        acc = self.accelerator
        acc.wait_for_everyone()
        path = None
        if self.is_main:
            positions = [self.stream.position]
            state = {"step": self.step, "rollout_index": self.rollout_index, "positions": positions,
                     "nonfinite_in_a_row": self.nonfinite_in_a_row, "config": self.cfg.to_dict(), "world": self.world,
                     "num_tokens": self.num_tokens}
            path = save_checkpoint(
                self.run_dir, self.step, save_model=self._save_model, optimizer=self.optimizer, scheduler=self.scheduler,
                buffer=self.buffer.to_state() if self.buffer is not None else None, state=state, keep=self.cfg.save_total_limit)
        acc.wait_for_everyone()
        return path

    def _save_model(self, path: Path) -> None:
        """The full model through the adapter's `save_pretrained`; with LoRA only the adapter weights (peft format,
        load with `peft.PeftModel.from_pretrained(base, path)`) plus `mmrl_adapter.json` naming the base model."""
        if is_peft_model(self.policy.model):
            self.policy.unwrapped.save_pretrained(path)
            meta = {"family": self.policy.family, "peft_adapter": True, "base_model": self.cfg.model_name_or_path,
                    "generation_defaults": getattr(self.policy, "generation_defaults", {})}
            (path / "mmrl_adapter.json").write_text(json.dumps(meta, indent=2, default=str))
        else:
            self.policy.save_pretrained(path)

    def _maybe_resume(self) -> bool:
        cfg = self.cfg
        if not cfg.resume_from:
            return False
        path = latest_checkpoint(self.run_dir) if cfg.resume_from == "auto" else Path(cfg.resume_from)
        if path is None:
            return False  # nothing to resume: a fresh run
        ck = load_checkpoint(path)
        if self.is_main:
            remove_stale(self.run_dir)
        st = ck["state"]
        if st.get("world", 1) != self.world:
            raise TrainingError(f"checkpoint {path} was written by {st.get('world')} processes; this run has {self.world}")
        load_model_weights(self.policy.unwrapped, path / "model")
        self.optimizer.load_state_dict(ck["optimizer"])
        self.scheduler.load_state_dict(ck["scheduler"])
        torch.set_rng_state(ck["rng"])
        self.step = int(st["step"])
        self.rollout_index = int(st["rollout_index"])
        self.nonfinite_in_a_row = int(st.get("nonfinite_in_a_row", 0))
        self.num_tokens = int(st.get("num_tokens", 0))
        self.stream.position = int(st["positions"][0])
        self.buffer = Buffer.from_state(ck["buffer"]) if ck["buffer"] is not None else None
        if self.buffer is not None:
            self.buffer.rollout = self.buffer.rollout.to(self.accelerator.device)
        return True

    # ============================================================================== signals, pictures

    def _install_signal_handlers(self) -> dict:
        """SIGTERM and Ctrl-C (SIGINT) ask for a stop at the end of the current step, with a checkpoint; a second
        Ctrl-C stops at once (the last checkpoint stays intact: checkpoints are written atomically)."""
        if os.name == "nt" or threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum, frame):
            if signum == signal.SIGINT and self._stop_signal is not None:
                raise KeyboardInterrupt("second Ctrl-C: stopped at once, without a checkpoint of the current step")
            self._stop_signal = signum
            # os.write, not print: a signal handler may interrupt a print to stderr (reentrant call)
            os.write(2, f"\nmmrl: {signal.Signals(signum).name} received; stopping after the current step with a "
                        f"checkpoint (Ctrl-C again stops at once)\n".encode())

        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                old[sig] = signal.getsignal(sig)
                signal.signal(sig, handler)
            except (ValueError, OSError):  # pragma: no cover - not allowed here
                old.pop(sig, None)
        return old

    def _restore_signal_handlers(self, old: dict) -> None:
        for sig, h in (old or {}).items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)

    def _stop_requested(self) -> int:
        """The signal that asked for a stop (0 if none), agreed by every process: if one process stopped alone, the
        others would wait for it forever."""
        signum = self._stop_signal or 0
        if self.world > 1:
            import torch.distributed as dist

            t = torch.tensor([signum], device=self.accelerator.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            signum = int(t.item())
        return signum

    def _write_credit_pictures(self, buf: Buffer) -> None:
        from mmrl.credit_viz import write_credit_pictures

        if buf.credit is None:
            return
        write_credit_pictures(self.run_dir / "credit", self.step, self.policy, buf.rollout, buf.credit, buf.rewards)


# ===================================================================================================== helpers

def _fault_injection(point: str, step: int) -> None:
    """Test hook: `MMRL_KILL_AT=<point>:K` makes the process SIGKILL itself there (crash tests; `mmrl.faults`)."""
    fault_point(point, step)


def _soft_overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int | None) -> torch.Tensor:
    """DAPO eq. 13 (soft overlong punishment): 0 up to L_max - L_cache, then linearly down to -1 at L_max."""
    cache = buffer_len if buffer_len is not None else max(1, max_len // 5)
    start = max_len - cache
    over = (lengths.float() - start).clamp(min=0)
    return -(over / cache).clamp(max=1.0)


def behaviour_is_current(cfg: TrainConfig) -> bool:
    """Whether the behaviour (old) log-probs are the detached log-probs of the gradient forward itself.

    With one optimizer step per rollout (`num_iterations = 1`) the policy that sampled is the policy being updated,
    and a separate no-grad forward would give the very numbers the gradient forward gives (same code, same
    micro-batches, same mask seeds: the first step's ratio is exactly 1). So that forward is skipped, as TRL skips
    it (`old_per_token_logps = None` when generation and optimizer steps are aligned), and the statistics taken at
    buffer time (entropy; DGPO's Hellinger deviation against the reference, whose pass also gives the KL's
    reference log-probs) are taken from the gradient forward's logits. DMPO has no behaviour log-probs."""
    return cfg.num_iterations == 1 and cfg.method != "dmpo"


def _token_metrics(buf: Buffer, entropy: torch.Tensor, h2: torch.Tensor | None) -> None:
    """Buffer metrics of the per-token statistics: mean policy entropy; DGPO's weights and mean deviation."""
    mask = buf.loss_mask
    count = mask.sum().clamp(min=1)
    buf.metrics["entropy"] = float((entropy * mask).sum() / count)
    if h2 is not None and buf.token_weights is not None:
        buf.metrics.update(_weight_metrics("dgpo", buf.token_weights, mask))
        buf.metrics["dgpo/h2_mean"] = float((h2 * mask).sum() / count)


def _weight_metrics(prefix: str, w: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std, max of token weights over valid tokens and the fraction above 2."""
    v = w[mask]
    if v.numel() == 0:
        return {}
    return {f"{prefix}/weight_mean": float(v.mean()), f"{prefix}/weight_std": float(v.std()) if v.numel() > 1 else 0.0,
            f"{prefix}/weight_max": float(v.max()), f"{prefix}/frac_weight_gt_2": float((v > 2).float().mean())}


def _sequence_elbo(masked_sum: torch.Tensor, noised: NoisedBatch) -> torch.Tensor:
    """[R, n] per-copy sequence log-likelihood estimates: exact for AR adapters (R = 1, rates 1), else the ELBO
    `sum_masked log p * |o| / m` (LLaDA's 1/t weighting)."""
    if noised.num_copies == 1 and bool((noised.rates == 1).all()):
        return masked_sum
    n_tokens = noised.noise_mask.any(0).sum(-1).to(masked_sum.dtype)  # [n] maskable positions |o|
    counts = noised.noise_mask.sum(-1).to(masked_sum.dtype).clamp(min=1)  # [R, n]
    return masked_sum * n_tokens / counts


def _peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def train(cfg: TrainConfig, **kwargs) -> dict[str, Any]:
    """Build a `Trainer` for `cfg` and run it; returns the last step's metrics."""
    return Trainer(cfg, **kwargs).train()
