"""Real execution: offloaded inference (offload/)."""
