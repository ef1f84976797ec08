"""Settings -> a planned deployment (TP/PP/EP, memory fit, placement) -> one run: plain, speculative or disaggregated."""
