"""memq behind the interfaces of agent frameworks, on the agent's side.

Each module wraps :class:`memq.contracts.client.MemoryClient` in one
framework's own abstractions and imports that framework, which only its
extra installs: :mod:`memq.contracts.adapters.langgraph` and
:mod:`memq.contracts.adapters.langgraph_context` (``pip install
memq[langgraph]``, LangGraph's store and an agent's model context),
:mod:`memq.contracts.adapters.adk` (``pip install memq[adk]``, Google ADK's
session and memory services), :mod:`memq.contracts.adapters.openai_agents`
(``pip install memq[openai-agents]``, the OpenAI Agents SDK's session) and
:mod:`memq.contracts.adapters.langchain` (``pip install memq[langchain]``,
LangChain's chat message history). Nothing here imports those packages, so
``memq.contracts`` stays as light as it was.
"""
