"""The buffer keeps a method's own tensors in `method_state`; checkpoints of either layout load back."""
import torch

from mmrl.core.protocol import Rollout
from mmrl.training.buffer import Buffer


def _buffer(**kw) -> Buffer:
    r = Rollout(prompt_ids=torch.ones(2, 3, dtype=torch.long), prompt_mask=torch.ones(2, 3, dtype=torch.bool),
                response_ids=torch.ones(2, 4, dtype=torch.long), response_mask=torch.ones(2, 4, dtype=torch.bool),
                group_size=2, prompts=["a", "a"], completions=["x", "y"])
    return Buffer(rollout=r, rewards=torch.tensor([1.0, 0.0]), advantages=torch.tensor([0.5, -0.5]),
                  loss_mask=torch.ones(2, 4, dtype=torch.bool), mask_seeds=[7], old_logp=[], **kw)


def test_method_state_round_trips_through_a_checkpoint(tmp_path):
    buf = _buffer(method_state={"weights": torch.tensor([0.25, 0.75]), "elbo_v": torch.tensor([-3.0, -4.0])})
    torch.save(buf.to_state(), tmp_path / "b.pt")
    back = Buffer.from_state(torch.load(tmp_path / "b.pt", weights_only=True))
    assert set(back.method_state) == {"weights", "elbo_v"}
    torch.testing.assert_close(back.method_state["weights"], torch.tensor([0.25, 0.75]))


def test_a_checkpoint_with_the_old_named_fields_loads_into_method_state():
    state = _buffer().to_state()
    del state["method_state"]
    state.update(dmpo_w=torch.tensor([0.5, 0.5]), dmpo_w_base=None, dmpo_elbo_v=torch.tensor([-1.0, -2.0]),
                 token_weights=torch.full((2, 4), 2.0))
    back = Buffer.from_state(state)
    assert sorted(back.method_state) == ["elbo_v", "token_weights", "weights"]
    torch.testing.assert_close(back.method_state["elbo_v"], torch.tensor([-1.0, -2.0]))
    assert not hasattr(back, "dmpo_w")
