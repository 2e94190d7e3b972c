"""Linear read-outs of a model's features, the diagnostics of docs/RESULTS.md "Issue 25, item 5": is a quantity (an
image token's column, a named object's column, an answer) linearly decodable from the states a model computes?"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_read_out(x_tr: torch.Tensor, y_tr: torch.Tensor, x_va: torch.Tensor, classes: int, *, steps: int,
                    lr: float = 1e-2, weight_decay: float = 0.0) -> tuple[float, torch.Tensor]:
    """Softmax regression of labels y_tr [n] (in [0, classes)) on features x_tr [n, H], standardised with the
    training mean and std, weights from zero, full-batch Adam for `steps` steps. Returns (training accuracy, the
    predicted class of each validation row [m]) for features x_va [m, H]."""
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6  # [H]
    w = torch.zeros(x_tr.shape[1], classes, requires_grad=True)  # [H, classes]
    b = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy((x_tr - mu) / sd @ w + b, y_tr).backward()
        opt.step()
    with torch.no_grad():
        fit = float(((x_tr - mu) / sd @ w + b).argmax(-1).eq(y_tr).float().mean())
        return fit, ((x_va - mu) / sd @ w + b).argmax(-1)  # [m]
