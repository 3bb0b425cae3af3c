"""``mb top``: a terminal dashboard of a live cluster (textual), drawn from a
:class:`~minibatch.live.model.LiveCluster` that the event stream keeps current."""
