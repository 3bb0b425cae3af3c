"""Local clusters: node layouts and starting/stopping the daemons (mb up/down)."""
