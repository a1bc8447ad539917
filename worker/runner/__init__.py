"""The model runner: scheduler decisions in, sampled tokens out."""
