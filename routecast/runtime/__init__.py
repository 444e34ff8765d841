"""Real execution: offloaded inference (offload/), expert parallelism on torch.distributed (ep/), and eMoE's
quality and task-sensitivity measurements on a real model (emoe/)."""
