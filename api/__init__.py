"""The agent server: OpenEnv-compatible HTTP, WebSocket and MCP over sessions that live in the log.

Build it with `api.app.create_app()`; `companyos serve` runs it on Uvicorn.
"""
