"""``mb web``: the live cluster as a page on 127.0.0.1, pushed by server-sent events."""
