"""minibatch: a real batch system for one workstation."""

__version__ = "0.1.0"
