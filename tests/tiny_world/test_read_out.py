"""`mmrl.tiny_world.read_out.linear_read_out` on data whose answer is known by construction."""
import torch

from mmrl.tiny_world.read_out import linear_read_out


def test_reads_a_linearly_coded_label_and_not_noise():
    g = torch.Generator().manual_seed(0)
    y_tr, y_va = torch.randint(0, 3, (300,), generator=g), torch.randint(0, 3, (100,), generator=g)
    codes = torch.eye(3) * 4.0  # the label is one of three directions, plus small noise in 5 dimensions
    coded = lambda y: torch.cat([codes[y], torch.randn(len(y), 2, generator=g)], 1)  # noqa: E731
    fit, predicted = linear_read_out(coded(y_tr), y_tr, coded(y_va), 3, steps=300)
    assert fit == 1.0 and predicted.shape == (100,) and bool(predicted.eq(y_va).all())
    noise_tr, noise_va = torch.randn(300, 5, generator=g), torch.randn(100, 5, generator=g)  # no signal: near chance
    _, guessed = linear_read_out(noise_tr, y_tr, noise_va, 3, steps=300)
    assert float(guessed.eq(y_va).float().mean()) < 0.5
