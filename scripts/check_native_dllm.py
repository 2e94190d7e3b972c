"""Development-time check of `models/dllm_native.py` against the public LLaDA and Dream modelling code (issue 29).

The modelling files are NOT part of this repository (their code does not carry over); fetch them once, e.g.
Fast-dLLM's copies (github.com/NVlabs/Fast-dLLM, `llada/model/` and `dream/model/`), into a directory outside the
repository, and point `--code` at it:

    python scripts/check_native_dllm.py --code /work/fetched/fast_dllm

For each family it builds the shipped model class with a small random configuration (float32), saves it as a
checkpoint (config.json + safetensors), loads that checkpoint with `models.dllm_native.load_native` (no remote code),
and compares the logits of both on random unpadded inputs; then it checks that the native model's prefix cache
(`BackboneLogits.prefill` / `suffix`) and dual cache (`block`) give the uncached logits. Exit code 0 when every
maximum absolute difference is below `--atol`.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch


def _llada(code: Path, tmp: Path, gqa: bool, tied: bool):
    from llada.model.configuration_llada import LLaDAConfig  # noqa: E402 - from --code
    from llada.model.modeling_llada import LLaDAModelLM

    cfg = LLaDAConfig(d_model=64, n_heads=4, n_kv_heads=2 if gqa else 4, n_layers=2, mlp_hidden_size=96,
                      activation_type="silu", block_type="llama", rope=True, rope_theta=500000.0, layer_norm_type="rms",
                      rms_norm_eps=1e-5, weight_tying=tied, include_bias=False, vocab_size=300, embedding_size=320,
                      mask_token_id=310, eos_token_id=2, pad_token_id=1, max_sequence_length=128, init_device="cpu",
                      flash_attention=False, attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0)
    torch.manual_seed(0)
    model = LLaDAModelLM(cfg, init_params=True).eval()
    with torch.no_grad():  # LLaDA's init leaves the norms at 1: perturb them so the mapping of every tensor shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("ln_f.weight"):
                p.add_(0.1 * torch.randn_like(p))
    out = tmp / f"llada_gqa{int(gqa)}_tied{int(tied)}"
    model.save_pretrained(out, safe_serialization=True)
    return model, out, lambda m, x: m(input_ids=x, use_cache=False, return_dict=True).logits


def _default_rope(config, device=None, **_):
    """The plain RoPE frequencies (Su et al. 2021) that transformers < 5 registered as "default", which Dream's code
    (written for transformers 4.4x) looks up: inv_freq = theta^(-2i / d), attention scaling 1."""
    dim = config.hidden_size // config.num_attention_heads
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float().to(device) / dim))
    return inv, 1.0


def _dream(code: Path, tmp: Path, gqa: bool, tied: bool):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ROPE_INIT_FUNCTIONS.setdefault("default", _default_rope)  # a compatibility shim for the shipped code only
    from dream.model.configuration_dream import DreamConfig  # noqa: E402 - from --code
    from dream.model.modeling_dream import DreamModel

    cfg = DreamConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2 if gqa else 4, max_position_embeddings=128, rms_norm_eps=1e-6,
                      rope_theta=1000000.0, tie_word_embeddings=tied, mask_token_id=310, pad_token_id=1, eos_token_id=2,
                      bos_token_id=0, attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    if isinstance(getattr(DreamModel, "_tied_weights_keys", None), list):  # transformers 5 wants {target: source}
        DreamModel._tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    torch.manual_seed(0)
    try:
        model = DreamModel(cfg).eval()
    finally:
        if ROPE_INIT_FUNCTIONS.get("default") is _default_rope:
            del ROPE_INIT_FUNCTIONS["default"]  # transformers' own classes must not see the shim
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(0.2 * torch.randn_like(p)) if p.dim() > 1 else p.add_(0.1 * torch.randn_like(p))
    out = tmp / f"dream_gqa{int(gqa)}_tied{int(tied)}"
    # the checkpoint layout Dream's hub repositories have (config.json + model.safetensors); written by hand since
    # the shipped class predates transformers 5's save_pretrained (its tied-weight keys are a list)
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    cfg.save_pretrained(out)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    # Dream's own sampler calls model(x, attention_mask, tok_idx); "full" when nothing is padded
    return model, out, lambda m, x: m(x, "full", None).logits


def _cache_checks(native, x: torch.Tensor, shift: bool) -> float:
    """Max |prefix / dual cache - uncached| of the native model's aligned logits on one block."""
    from mmrl.models.dllm_backbone import BackboneLogits

    fn = BackboneLogits(native, None, kind="native", shift=shift)
    s, e = x.shape[1] // 2, x.shape[1] // 2 + 4
    with torch.no_grad():
        full = fn.window(x, s)
        worst = float((fn.prefill(x, s) - full).abs().max())
        worst = max(worst, float((fn.suffix(x, s) - full).abs().max()))
        fn.prefill(x, s)
        worst = max(worst, float((fn.block(x, s, e) - full[:, : e - s]).abs().max()))
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", required=True, help="directory holding llada/model/ and dream/model/ (fetched, not committed)")
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    code = Path(args.code).resolve()
    sys.path.insert(0, str(code))
    from mmrl.models.dllm_native import load_native

    torch.set_num_threads(1)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for family, build in (("llada", _llada), ("dream", _dream)):
            for gqa in (False, True):
                for tied in (False, True):
                    shipped, path, call = build(code, Path(tmp), gqa, tied)
                    native, why = load_native(path)
                    if native is None:
                        print(f"{family} gqa={gqa} tied={tied}: not convertible: {why}")
                        failures += 1
                        continue
                    x = torch.randint(3, 300, (3, 24), generator=torch.Generator().manual_seed(1))
                    with torch.no_grad():
                        ref, got = call(shipped, x), native(input_ids=x).logits
                    diff = float((ref.float() - got.float()).abs().max())
                    cache = _cache_checks(native, x, shift=family == "dream")
                    ok = diff <= args.atol and cache <= args.atol
                    failures += not ok
                    print(f"{family} gqa={gqa} tied={tied}: {type(native).__name__}, logits max |shipped - native| = "
                          f"{diff:.2e} (scale {float(ref.abs().max()):.2f}); cache vs uncached {cache:.2e}: "
                          f"{'ok' if ok else 'FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
