"""The CPU speed-ups of the causal-LM step (issue 29) compute what the plain code computes:

- `selective_log_softmax` / `selective_log_softmax_and_entropy` (one fused autograd function) against
  `log_softmax(...).gather` and `-sum p log p`, values and gradients;
- `models.kv_cache.reserve_cache`: decoding into the reserved buffers gives bitwise the logits of transformers'
  concatenating `DynamicCache`, also when an update overflows the reserve;
- `models.cpu_linear.packed_linears`: oneDNN linears against `F.linear` with and without the gradient, restored
  after the block, left alone where they do not apply.
"""
import pytest
import torch

from mmrl.models.base import selective_log_softmax, selective_log_softmax_and_entropy
from mmrl.models.causal_lm import CausalLMAdapter
from mmrl.models.cpu_linear import onednn_linear, onednn_linear_available, packed_linears
from mmrl.models.kv_cache import ReservedLayer, reserve_cache


def _unfused(logits, index, temperature):
    x = logits.float() / temperature
    logp = torch.log_softmax(x, -1)
    return logp.gather(-1, index[..., None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 5, None])
def test_fused_log_softmax_equals_the_unfused_graph(dtype, temperature, chunk):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 41, generator=g) * 4).to(dtype).requires_grad_()
    index = torch.randint(0, 41, (3, 7), generator=g)
    upstream = torch.randn(3, 7, generator=g)
    ref, ref_ent = _unfused(logits, index, temperature)
    (ref_grad,) = torch.autograd.grad((ref * upstream).sum(), logits)
    logp, ent = selective_log_softmax_and_entropy(logits, index, temperature=temperature, chunk_size=chunk)
    (grad,) = torch.autograd.grad((logp * upstream).sum(), logits)
    torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    assert grad.dtype == dtype and not ent.requires_grad
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=1e-5, atol=1e-6)
    alone = selective_log_softmax(logits, index, temperature=temperature, chunk_size=chunk)
    torch.testing.assert_close(alone, logp, rtol=0, atol=0)


def test_fused_log_softmax_hand_computed_and_empty():
    # logits [0, log 3]: softmax [1/4, 3/4]; d logp[1] / d logits = onehot(1) - softmax = [-1/4, 1/4]
    logits = torch.tensor([[0.0, float(torch.log(torch.tensor(3.0)))]], requires_grad=True)
    logp, ent = selective_log_softmax_and_entropy(logits, torch.tensor([1]))
    logp.sum().backward()
    torch.testing.assert_close(logp, torch.log(torch.tensor([0.75])))
    torch.testing.assert_close(ent, torch.tensor([-(0.25 * torch.log(torch.tensor(0.25)) + 0.75 * torch.log(torch.tensor(0.75)))]))
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.25, 0.25]]))
    empty = selective_log_softmax(torch.zeros(2, 0, 5), torch.zeros(2, 0, dtype=torch.long))
    assert empty.shape == (2, 0)


def _decode_logits(model, ids, steps, reserve):
    """Logits of a prefill and `steps` greedy decoding steps, through a DynamicCache (optionally reserved)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, use_cache=True, cache=cache)
    if reserve is not None:
        assert reserve_cache(cache, reserve) == model.config.num_hidden_layers
        assert all(type(layer) is ReservedLayer for layer in cache.layers)
    logits = [out.logits[:, -1]]
    for _ in range(steps):
        tok = logits[-1].argmax(-1, keepdim=True)  # [B, 1]
        out = model(input_ids=tok, use_cache=True, cache=cache)
        logits.append(out.logits[:, -1])
    assert cache.get_seq_length() == ids.shape[1] + steps
    return torch.stack(logits)


@pytest.mark.parametrize("reserve", [6, 2, 0])  # room for every step; overflow after 2; overflow at once
def test_reserved_cache_decodes_bitwise_like_concatenation(reserve):
    model = CausalLMAdapter.tiny(seed=0).model.eval()
    ids = torch.randint(5, 60, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = _decode_logits(model, ids, 6, None)
        got = _decode_logits(model, ids, 6, reserve)
    assert torch.equal(got, ref)


def test_reserve_cache_rejects_a_bad_size_and_skips_empty_layers():
    from transformers import DynamicCache

    with pytest.raises(ValueError, match="extra must be an integer >= 0"):
        reserve_cache(DynamicCache(), -1)
    assert reserve_cache(DynamicCache(), 4) == 0


needs_onednn = pytest.mark.skipif(not onednn_linear_available(), reason="oneDNN linear kernels are not available on this build")


@needs_onednn
def test_packed_linears_match_f_linear_without_and_with_the_gradient():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.Tanh(), torch.nn.Linear(20, 7, bias=False))
    x = torch.randn(3, 4, 12, requires_grad=True)
    ref = net(x)
    ref_grads = torch.autograd.grad(ref.square().sum(), [x, *net.parameters()])
    with torch.no_grad():
        with packed_linears(net, 12) as n:
            fast = net(x)
        assert n == 2
    torch.testing.assert_close(fast, ref.detach(), rtol=1e-5, atol=1e-5)
    with torch.no_grad(), packed_linears(net, 12, pack=False):  # oneDNN on the weights as they are
        torch.testing.assert_close(net(x), ref.detach(), rtol=1e-5, atol=1e-5)
    with packed_linears(net, 12, grad=True):
        out = net(x)
    assert type(out.grad_fn.next_functions[0][0]).__name__ == "OneDNNLinearBackward"  # under the reshaping view
    grads = torch.autograd.grad(out.square().sum(), [x, *net.parameters()])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all("forward" not in m.__dict__ for m in net.modules())  # restored


@needs_onednn
def test_packed_linears_leave_other_layers_and_graphs_alone():
    torch.manual_seed(0)
    half = torch.nn.Linear(8, 8).to(torch.bfloat16)
    hooked = torch.nn.Linear(8, 8)
    hooked.register_forward_hook(lambda *a: None)
    with packed_linears(torch.nn.ModuleList([half, hooked]), 4) as n:
        assert n == 0
    lin = torch.nn.Linear(8, 3)
    x = torch.randn(2, 8, requires_grad=True)
    with packed_linears(lin, 2):  # grad=False: a graph-building call keeps F.linear's backward
        out = lin(x)
    assert type(out.grad_fn).__name__ == "AddmmBackward0"
    # a layer that checkpoints recomputes its forward outside the block: the graph path is not patched
    lin.gradient_checkpointing = True
    with packed_linears(lin, 2, grad=True):
        out = lin(x)
    assert type(out.grad_fn).__name__ == "AddmmBackward0"


@needs_onednn
def test_onednn_linear_function_hand_checked():
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [0.5, -1.0], [0.0, 3.0]], requires_grad=True)
    b = torch.tensor([0.0, 1.0, -1.0], requires_grad=True)
    y = onednn_linear(x, w, b)  # [1, 3] = [1, 0.5 - 2 + 1, 6 - 1]
    torch.testing.assert_close(y, torch.tensor([[1.0, -0.5, 5.0]]))
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([[1.5, 2.0]]))  # column sums of w
    torch.testing.assert_close(w.grad, torch.tensor([[1.0, 2.0]] * 3))
    torch.testing.assert_close(b.grad, torch.ones(3))
    z = onednn_linear(torch.randn(2, 3, 2, requires_grad=True), w, b)
    z[..., 0] = -1.0  # in place on the output (suppress_tokens does it to logits): allowed, gradient still flows
    z.sum().backward()
