"""runtime/emoe/: eMoE measured on a real model (it runs the model, so it lives with the runtime, not in cache/).

    text_windows(tokenizer, TextConfig(...)) -> (tasks, windows, task_of, docs)     profile.py: held-out text
    profile_sensitivity(model, tasks, windows, task_of) -> Profile                  profile.py: §2.2.3 / §3.4
    run_quality(model, tokenizer, QualityConfig(...)) -> dict                       quality.py: perplexity per
        domain with a budget of the experts resident (eMoE, random, LRU, oracle) and fallback routing
    `routecast emoe profile|quality`                                                cli.py
The residency choice itself (eq. 2, layer budgets, LRU) is cache/emoe.py; the predictor is predict/emoe.py.
Importing this package does not import torch; its modules do.
"""
