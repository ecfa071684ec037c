"""KV events in vLLM's wire format (vLLM 0.33.0; decodes 0.9 and later): wire.py, the msgpack
payloads; frames.py, the ZMQ framing and replay protocol. Both kvroute's publisher
(worker/vllm_events/) and the router's subscriber (router/cluster/vllm_subscriber.py) use them.
"""
