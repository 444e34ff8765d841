"""Offloaded MoE inference: expert store (fast tier of slots), disk slow tier, predictive prefetch."""
