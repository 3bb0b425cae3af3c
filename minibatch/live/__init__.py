"""Live views of a running cluster: the model the events keep current, its feed."""
