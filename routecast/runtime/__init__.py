"""Real execution of routecast's plans: offloaded inference and expert parallelism on torch.distributed."""
