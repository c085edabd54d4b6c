"""`failsoft drill`: push requests past the GPU profile and through injected GPU failures, and record, step by
step, what the service decided and whether every job ended exactly once."""
