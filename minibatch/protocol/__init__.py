"""The wire protocol: versioned envelopes carrying typed, tagged messages (msgpack)."""

from minibatch.protocol.codec import PROTOCOL_VERSION, decode, decode_reply, encode

__all__ = ["PROTOCOL_VERSION", "decode", "decode_reply", "encode"]
