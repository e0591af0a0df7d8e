"""`memq mcp`: memq's memory as Model Context Protocol tools (stdio or
streamable HTTP), for one app: :mod:`.tools` (what a model can call),
:mod:`.server` (the server and its NATS client), :mod:`.http` (the HTTP
transport behind the gateway's API keys). Needs the ``mcp`` extra."""
