"""kvroute's Protocol 2 events published as vLLM KV events (translate.py, publisher.py), in the
wire format and framing of protocol/vllm/ (vLLM 0.33.0; decodes 0.9 and later).
"""
