"""Device mesh and logical-axis sharding rules."""
