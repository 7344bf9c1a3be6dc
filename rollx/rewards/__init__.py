"""Rewards from models: a scalar reward model scoring token sequences."""
