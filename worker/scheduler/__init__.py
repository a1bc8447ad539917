"""Token-budget scheduling: who computes how many tokens in each step."""
