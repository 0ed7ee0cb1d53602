"""Objectives, optimizer, sharded train state and the jitted train/eval step."""
