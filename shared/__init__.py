"""Code both services import: block hashing, errors, config plumbing, logging."""
