"""`image_positions.sincos_2d`: MAE's 2-D sine-cosine code, checked against the formula written out by hand."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mmrl.models.image_positions import sincos_2d


def test_sincos_2d_by_hand_and_its_order():
    side, dim = 3, 8  # two frequencies per axis: 10000 ** 0 = 1 and 10000 ** -0.5 = 0.01
    table = sincos_2d(side, dim)
    assert table.shape == (9, 8)
    r, c = 2, 1  # index r * side + c
    want = [math.sin(r), math.sin(0.01 * r), math.cos(r), math.cos(0.01 * r),
            math.sin(c), math.sin(0.01 * c), math.cos(c), math.cos(0.01 * c)]
    torch.testing.assert_close(table[r * side + c], torch.tensor(want, dtype=torch.float32))
    # the column half is the same along a column, the row half along a row
    grid = table.reshape(side, side, dim)
    assert torch.equal(grid[0, :, 4:], grid[2, :, 4:]) and torch.equal(grid[:, 0, :4], grid[:, 2, :4])
    with pytest.raises(ValueError, match="multiple of 4.*got 6"):
        sincos_2d(3, 6)


def test_sincos_init_on_the_qwen3_vl_vision_tower_codes_each_patch_s_own_cell():
    """The table row r * 12 + c reaches patch (r, c): Qwen3-VL's interpolation picks it with weight 1 on a 12 x 12
    grid, and the pos embeddings the tower adds, read in the tower's (2 x 2 merge) patch order, are the code of the
    patch's own cell."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from mmrl.tiny_world import models

    spec = models.TINY_MODELS["shapes-vqa-qwen3-words-sincos"]
    visual = models.build_untrained(spec).model.model.visual
    code = sincos_2d(12, 64)
    torch.testing.assert_close(visual.pos_embed.weight, 3.0 * code)
    idx, w = modeling_qwen3_vl.get_vision_interpolation_indices_and_weights(
        torch.tensor([[1, 12, 12]]), num_grid_per_side=12, mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners, spatial_merge_size=2, kwargs={})
    added = (visual.pos_embed(idx) * w[:, :, None]).sum(1)  # [144, 64], the tower's patch order
    # that order walks 2 x 2 blocks row-major, each block row-major: patch k is cell (r, c) below
    cells = [(2 * br + i, 2 * bc + j) for br in range(6) for bc in range(6) for i in range(2) for j in range(2)]
    torch.testing.assert_close(added, 3.0 * code[[r * 12 + c for r, c in cells]])
    with pytest.raises(ValueError, match="position_table_init must be 'sincos' or absent.*got 'ramp'"):
        models.build_untrained(dataclasses.replace(spec, arch={**spec.arch, "position_table_init": "ramp"}))
