"""ZeroMQ plumbing shared by the daemons and the commands."""
