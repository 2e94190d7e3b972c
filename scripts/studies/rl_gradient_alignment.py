"""Study (docs/RESULTS.md, "RL on a Sudoku base with headroom"): is the RL update's direction the supervised one, and
does it agree with itself from one rollout batch to the next? Measured at the base, on masked-diffusion Sudoku (where
no RL arm gains) and masked-diffusion Countdown (where diffu-GRPO gains, sampled).

    OMP_NUM_THREADS=1 python scripts/studies/rl_gradient_alignment.py OUT_JSON --batches 8

For each task, `--batches` rollout batches are drawn and scored exactly as the comparison's diffu-GRPO arm does
(`dmpo-vs-d1` on `sudoku4-mid`: 8 puzzles x 16 answers; `dllm-countdown3` on `countdown3-md`: 16 problems x 8
answers); the weights never move (the optimizer step is replaced by the measurement), so every gradient is taken at
the base. Per batch: g_rl, the gradient of the method's loss on that batch (as the trainer computes it, before
clipping), and g_sft, the gradient of the base's own pre-training loss on the same prompts' true answers (one copy
per answer, `mmrl.tiny_world.rft.truth_batches`' packing). Reported: cos(g_rl, g_sft) per batch; the cosine of their
sums over batches; the mean pairwise cosine between batches of g_rl and of g_sft (how much of one batch's direction
the next batch repeats: for a gradient of mean mu and per-batch noise of norm s, about |mu|^2 / (|mu|^2 + s^2)).
"""
import argparse
import itertools
import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from mmrl.config.train_config import load_config
from mmrl.data.tasks import load_task
from mmrl.tiny_world import register
from mmrl.tiny_world.models import TINY_MODELS, load_base_policy
from mmrl.tiny_world.pretrain import loss_options, pack_pairs
from mmrl.tiny_world.rft import masked_diffusion_nll
from mmrl.training.trainer import Trainer

logger = logging.getLogger("rl_gradient_alignment")


def flat_grad(params) -> torch.Tensor:
    """[P] the parameters' gradients concatenated (zeros where a parameter has none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def measure(task_name: str, base: str, cfg_overrides: dict, batches: int) -> dict:
    """g_rl and g_sft of `batches` rollout batches at the base (see the module docstring)."""
    task = load_task(task_name)
    policy = load_base_policy(base, progress=False)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    sft_loss = masked_diffusion_nll(0, **loss_options(TINY_MODELS[base].recipe))
    tmp = Path(tempfile.mkdtemp(prefix="gradalign-"))
    cfg = load_config(None, {**cfg_overrides, "output_dir": str(tmp / "run"), "max_steps": batches, "eval_steps": 0,
                             "save_steps": 0, "credit_steps": 0, "progress_bar": False})
    g_rl: list[torch.Tensor] = []
    g_sft: list[torch.Tensor] = []
    rewards: list[float] = []

    class Probe(Trainer):
        def _optimizer_step(self, buf, inner, part=0):
            self._buf = buf
            real_step = self.optimizer.step
            self.optimizer.step = lambda *a, **k: record(self)  # the weights stay the base's
            try:
                return super()._optimizer_step(buf, inner, part)
            finally:
                self.optimizer.step = real_step

    def record(trainer) -> None:
        g_rl.append(flat_grad(params))  # after clipping: a scale, which no cosine sees
        buf = trainer._buf
        answers = buf.columns["solution"]  # [N] the true answer of each response's prompt
        prompts = list(buf.rollout.prompts)
        x_p, m_p, x_r = pack_pairs(policy.tokenizer, [policy._prompt_text(p) for p in prompts], answers,
                                   cfg.max_completion_length, policy.pad_token_id, policy.eos_token_ids[0])
        templates = policy.response_templates(prompts, cfg.max_completion_length)
        fixed = (templates != policy.mask_token_id).cpu() if templates is not None else torch.zeros_like(x_r, dtype=torch.bool)
        for p in params:
            p.grad = None
        sft_loss(policy, (x_p, m_p, x_r, fixed)).backward()
        g_sft.append(flat_grad(params))
        for p in params:
            p.grad = None
        rewards.append(float(buf.rewards.float().mean()) if hasattr(buf, "rewards") else float("nan"))

    Probe(cfg, policy=policy, dataset=task.train, reward_funcs=cfg.reward_funcs or task.reward_funcs).train()
    shutil.rmtree(tmp, ignore_errors=True)
    per_batch = [cos(a, b) for a, b in zip(g_rl, g_sft)]
    pair = lambda gs: sum(cos(a, b) for a, b in itertools.combinations(gs, 2)) / max(1, len(gs) * (len(gs) - 1) // 2)  # noqa: E731
    out = {"task": task_name, "base": base, "batches": len(g_rl), "parameters": int(g_rl[0].numel()),
           "answers_per_batch": cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps,
           "cos_rl_sft_per_batch": per_batch, "cos_rl_sft_mean": sum(per_batch) / len(per_batch),
           "cos_rl_sft_of_sums": cos(torch.stack(g_rl).sum(0), torch.stack(g_sft).sum(0)),
           "pairwise_cos_rl": pair(g_rl), "pairwise_cos_sft": pair(g_sft), "batch_reward": rewards}
    logger.info(json.dumps({k: v for k, v in out.items() if k != "cos_rl_sft_per_batch"}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--only", choices=("sudoku", "countdown"), default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    register()
    from mmrl.tiny_world import reasoning_rl, replicate

    results = []
    if args.only in (None, "sudoku"):
        sudoku = replicate.arm_config("dmpo-vs-d1", "diffu-grpo (d1), F=1", seed=0, rollouts=args.batches, out=Path("."))
        results.append(measure("sudoku4", "sudoku4-mid", sudoku, args.batches))
    if args.only in (None, "countdown"):
        countdown = reasoning_rl.arm_config("dllm-countdown3", "diffu-GRPO", seed=0, out=Path("."), rollouts=args.batches)
        results.append(measure("countdown3", "countdown3-md", countdown, args.batches))
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
