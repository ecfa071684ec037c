"""`kvroute engine`: one engine replica as a standalone OpenAI-compatible server."""
