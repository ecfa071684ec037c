"""KV events in vLLM's wire format (vLLM 0.33.0; decodes 0.9 and later).

wire.py: the msgpack payloads; frames.py: the ZMQ framing and replay protocol;
translate.py and publisher.py: kvroute's Protocol 2 events published as vLLM events.
"""
