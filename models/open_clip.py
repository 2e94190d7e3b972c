"""open_clip models from local weights only (never a download), loaded once per process and configuration: the
`clip_score` reward (`mmrl.rewards.image_clip`) and GenEval's colour classifier (`mmrl.geneval.colors`) share it."""
from __future__ import annotations

from pathlib import Path

from mmrl.core.lazy import load_once


def check_local(model_name: str, pretrained: str | None) -> None:
    """Refuse anything but local weights (a Hub name, a download tag, a missing file or folder), before loading."""
    if model_name.startswith("hf-hub:"):
        raise ValueError(f"model_name {model_name!r} would download from the Hub; give a local directory as "
                         "'local-dir:/path' or an architecture name with local weights")
    if model_name.startswith("local-dir:"):
        if not Path(model_name[len("local-dir:"):]).is_dir():
            raise FileNotFoundError(f"open_clip directory {model_name[len('local-dir:'):]!r} does not exist")
        return
    if pretrained is None:
        raise ValueError(f"open_clip model {model_name!r} needs local weights: pass pretrained=<checkpoint file> "
                         "(mmrl never downloads weights) or model_name='local-dir:<folder>'")
    if not Path(pretrained).is_file():
        raise FileNotFoundError(f"open_clip weights {pretrained!r} are not a local file (tags such as 'openai' "
                                "would download; download the checkpoint yourself and pass its path)")


def load_open_clip(model_name: str, pretrained: str | None = None, device: str = "cpu"):
    """(model, preprocess, tokenizer) of a local open_clip model, loaded once per process and configuration."""
    check_local(model_name, pretrained)

    def load():
        try:
            import open_clip
        except ImportError as e:
            raise ImportError("the clip_score reward needs open_clip: pip install 'mmrl[clip]'") from e

        model, _, preprocess = open_clip.create_model_and_transforms(
            model_name, pretrained=None if model_name.startswith("local-dir:") else pretrained, device=device)
        return model.eval(), preprocess, open_clip.get_tokenizer(model_name)

    return load_once(("open_clip", model_name, pretrained, str(device)), load)
