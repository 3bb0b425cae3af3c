"""Cluster events over MQTT: the embedded broker and the server's publisher.

Topics, below the configured prefix (``minibatch/v1`` by default), carry JSON:

- ``{prefix}/jobs/<id>/<event>``: a job's life (``submitted``, ``state``, ...);
- ``{prefix}/nodes/<name>/state``: a node's state changes.
"""

from minibatch.events.publisher import EventPublisher, job_topic, node_topic, parse_url

__all__ = ["EventPublisher", "job_topic", "node_topic", "parse_url"]
