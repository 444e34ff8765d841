"""Expert parallelism on torch.distributed: routecast's slot plans executed by torchrun ranks (see run.py, forward.py)."""
