"""What the router and the engine replicas exchange, in one package both import and which
imports neither: the engine's request, delta, stats and pin types and the errors both sides
raise (engine.py), and vLLM's KV event wire format and ZMQ framing (vllm/)."""
