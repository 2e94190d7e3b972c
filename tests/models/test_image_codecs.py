"""Image codecs (models/image_codecs.py): the palette codec against hand-drawn pictures, the VQ codec on a tiny
Janus VQ model."""
import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from mmrl.models.image_codecs import DEFAULT_PALETTE, ImageCodec, PaletteCodec, VQCodec, codec_from_config

PAL = [(153, 153, 153), (220, 40, 40), (40, 80, 220), (235, 210, 40)]


def test_palette_decode_fills_cells_row_major():
    codec = PaletteCodec(PAL, grid=(2, 3), cell_px=3)
    assert isinstance(codec, ImageCodec)
    (img,) = codec.decode(torch.tensor([[0, 1, 2, 3, 2, 1]]))
    assert img.size == (9, 6) and img.mode == "RGB"
    # cell (row r, col c) covers x in [3c, 3c+3), y in [3r, 3r+3)
    assert img.getpixel((0, 0)) == PAL[0]
    assert img.getpixel((4, 2)) == PAL[1]  # row 0, col 1
    assert img.getpixel((8, 0)) == PAL[2]  # row 0, col 2
    assert img.getpixel((0, 3)) == PAL[3]  # row 1, col 0
    assert img.getpixel((5, 5)) == PAL[2]  # row 1, col 1
    assert img.getpixel((6, 4)) == PAL[1]  # row 1, col 2


@pytest.mark.parametrize("grid", [(4, 4), (3, 7), (12, 12)])
def test_palette_encode_inverts_decode(grid):
    codec = PaletteCodec(PAL, grid=grid, cell_px=2)
    ids = torch.randint(0, 4, (5, grid[0] * grid[1]), generator=torch.Generator().manual_seed(0))
    assert torch.equal(codec.encode(codec.decode(ids)), ids)


def test_palette_encode_of_a_drawn_picture():
    codec = PaletteCodec(PAL, grid=(4, 4), cell_px=5)
    img = Image.new("RGB", (20, 20), PAL[0])
    draw = ImageDraw.Draw(img)
    draw.rectangle([5, 0, 14, 9], fill=PAL[1])  # rows 0-1, cols 1-2
    draw.rectangle([15, 15, 19, 19], fill=PAL[3])  # row 3, col 3
    expected = [0, 1, 1, 0,
                0, 1, 1, 0,
                0, 0, 0, 0,
                0, 0, 0, 3]
    assert codec.encode([img]).tolist() == [expected]
    # small noise keeps the nearest colour; a 2x larger picture is box-filtered back onto the grid
    noisy = Image.fromarray(((torch.from_numpy(np.array(img)).int()
                              + torch.randint(-12, 13, (20, 20, 3), generator=torch.Generator().manual_seed(1)))
                             .clamp(0, 255).to(torch.uint8).numpy()))
    assert codec.encode([noisy]).tolist() == [expected]
    assert codec.encode([img.resize((40, 40), Image.Resampling.NEAREST)]).tolist() == [expected]


def test_palette_errors_name_the_bad_value():
    codec = PaletteCodec(PAL, grid=(2, 2))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        codec.decode(torch.tensor([[0, 1, 2, 4]]))
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        codec.decode(torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match="distinct"):
        PaletteCodec([(1, 2, 3), (1, 2, 3)])
    with pytest.raises(ValueError, match="RGB"):
        PaletteCodec([(1, 2, 3), (1, 2, 300)])
    with pytest.raises(ValueError, match="codebook_size=17"):
        PaletteCodec.default(17)


def test_default_palette_and_config_round_trip():
    codec = PaletteCodec.default(8, grid=(3, 5), cell_px=2)
    assert codec.palette == list(DEFAULT_PALETTE[:8]) and codec.palette[0] == (153, 153, 153)
    again = codec_from_config(codec.config())
    assert again.config() == codec.config()
    ids = torch.arange(15).remainder(8)[None]
    assert again.decode(ids)[0].tobytes() == codec.decode(ids)[0].tobytes()
    with pytest.raises(ValueError, match="unknown image codec type 'jpeg'"):
        codec_from_config({"type": "jpeg"})
    with pytest.raises(ValueError, match="model="):
        codec_from_config({"type": "vq"})


def test_vq_codec_on_a_tiny_janus_model():
    from mmrl.models.janus import JanusAdapter

    model = JanusAdapter.tiny(seed=0, grid=(3, 3), codebook_size=5, codec="vq").unwrapped_core
    codec = VQCodec(model)
    assert codec.grid == (3, 3) and codec.codebook_size == 5 and codec.image_px == 6
    ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3], [4] * 9])
    imgs = codec.decode(ids)
    assert [im.size for im in imgs] == [(6, 6)] * 2
    with torch.no_grad():
        pixels = model.decode_image_tokens(ids)[0]  # [H, W, 3] in [-1, 1]
    x = float(pixels[2, 4, 1].clamp(-1, 1))
    assert imgs[0].getpixel((4, 2))[1] == round((x + 1) * 127.5)
    codes = codec.encode(imgs)
    assert codes.shape == (2, 9) and codes.dtype == torch.long and 0 <= int(codes.min()) and int(codes.max()) < 5
    assert codec_from_config(codec.config(), model).grid == (3, 3)
