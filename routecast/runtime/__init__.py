"""Real execution: offloaded inference (offload/) and expert parallelism on torch.distributed (ep/)."""
