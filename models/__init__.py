"""Model-family adapters (installed as `mmrl.models`): each implements the protocol of `mmrl.protocol`."""
