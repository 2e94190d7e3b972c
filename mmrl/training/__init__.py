"""The one training loop (`Trainer`) and its private parts: rollout buffer, prompt stream, policy
factory, evaluation during training, signals."""
