"""What a launched run leaves, typed: its per-step records (``run_result``) and its state
beyond the weights (``training_state``).
"""
