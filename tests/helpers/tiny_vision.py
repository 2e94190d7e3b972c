"""Tiny randomly initialised vision models of the real classes, saved to local folders the way users ship them
(shared by the image reward and GenEval tests). Seeded; a few 100k parameters each; nothing is downloaded."""
from __future__ import annotations

import json
import string
from pathlib import Path

import torch

COCO_SUBSET = ["person", "bicycle", "mouse", "dog", "tv"]  # "mouse" is GenEval's "computer mouse"


def tiny_open_clip_dir(path: Path, seed: int = 0) -> Path:
    """An open_clip `local-dir:` folder: open_clip_config.json + open_clip_model.safetensors (real BPE tokenizer)."""
    import open_clip
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model_cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    model = open_clip.CLIP(**{"embed_dim": 16, "vision_cfg": model_cfg["vision_cfg"], "text_cfg": model_cfg["text_cfg"]})
    path.mkdir(parents=True, exist_ok=True)
    (path / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {}}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "open_clip_model.safetensors"))
    return path


def tiny_mask2former_dir(path: Path, labels=COCO_SUBSET, seed: int = 0) -> Path:
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor, SwinConfig

    torch.manual_seed(seed)
    # 64 px inputs: the coarsest feature map must hold more than one value per GroupNorm group at batch size 1
    backbone = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                          window_size=2, out_features=["stage1", "stage2", "stage3", "stage4"])
    cfg = Mask2FormerConfig(backbone_config=backbone, hidden_dim=32, num_queries=6, encoder_layers=1, decoder_layers=2,
                            num_attention_heads=2, dim_feedforward=32, encoder_feedforward_dim=32, mask_feature_size=32,
                            feature_size=32, num_labels=len(labels), id2label=dict(enumerate(labels)),
                            label2id={n: i for i, n in enumerate(labels)}, common_stride=4, use_pretrained_backbone=False)
    Mask2FormerForUniversalSegmentation(cfg).eval().save_pretrained(path)
    Mask2FormerImageProcessor(size={"height": 64, "width": 64}).save_pretrained(path)
    return path


def _clip_char_tokenizer(path: Path):
    """A CLIP BPE tokenizer over single letters (no merges), written to `path`."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase:
        vocab[c] = len(vocab)
    for c in string.ascii_lowercase:
        vocab[c + "</w>"] = len(vocab)
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(path / "vocab.json"), str(path / "merges.txt"), pad_token="<|endoftext|>"), len(vocab)


def tiny_owlv2_dir(path: Path, seed: int = 0) -> Path:
    from transformers import Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessor, Owlv2Processor

    torch.manual_seed(seed)
    tok, vocab_size = _clip_char_tokenizer(path / "_tok")
    cfg = Owlv2Config(
        text_config=dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=32, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=32)
    Owlv2ForObjectDetection(cfg).eval().save_pretrained(path)
    Owlv2Processor(image_processor=Owlv2ImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok).save_pretrained(path)
    return path


def tiny_grounding_dino_dir(path: Path, seed: int = 0) -> Path:
    from transformers import (BertConfig, BertTokenizer, GroundingDinoConfig, GroundingDinoForObjectDetection,
                              GroundingDinoImageProcessor, GroundingDinoProcessor, SwinConfig)

    torch.manual_seed(seed)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + list(string.ascii_lowercase) + [
        "##" + c for c in string.ascii_lowercase]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(words) + "\n")
    tok = BertTokenizer(str(path / "vocab.txt"))
    # 64 px inputs: the coarsest feature map must hold more than one value per GroupNorm group at batch size 1
    backbone = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                          window_size=2, out_features=["stage2", "stage3", "stage4"])
    text = BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=37, max_position_embeddings=128)
    cfg = GroundingDinoConfig(backbone_config=backbone, text_config=text, d_model=32, encoder_layers=1, decoder_layers=2,
                              encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                              num_queries=6, num_feature_levels=3, encoder_n_points=2, decoder_n_points=2, max_text_len=128,
                              use_pretrained_backbone=False)
    GroundingDinoForObjectDetection(cfg).eval().save_pretrained(path)
    GroundingDinoProcessor(image_processor=GroundingDinoImageProcessor(size={"height": 64, "width": 64}),
                           tokenizer=tok).save_pretrained(path)
    return path


def tiny_stable_diffusion_dir(path: Path, words=("a", "photo", "of", "red", "blue", "square", "circle"), seed: int = 0) -> Path:
    """A tiny random `StableDiffusionPipeline` (UNet 8/16 channels, one-block VAE, one-layer CLIP text encoder, the
    offline tiny CLIP tokenizer, DDIM, no safety checker) saved with `save_pretrained`: 16 x 16 images at 8 x 8
    latents."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from mmrl.models.clip_tokenizer import tiny_clip_tokenizer

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=16,
                                norm_num_groups=4, attention_head_dim=2)
    vae = AutoencoderKL(block_out_channels=(8,), in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                        up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=4, sample_size=16)
    tok = tiny_clip_tokenizer(words, model_max_length=8)
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, max_position_embeddings=8, bos_token_id=tok.bos_token_id,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    pipe = StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text, tokenizer=tok, scheduler=DDIMScheduler(),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(path)
    return path
