"""The encoder, its configuration and the heads built on it."""
