"""The gateway's routes, one module-level router per resource group, in the
order the API lists them; :func:`~memq.workers.http.api.build_api` includes them."""

from memq.workers.http.routes.facts import facts_router
from memq.workers.http.routes.memory import memory
from memq.workers.http.routes.search import search_router
from memq.workers.http.routes.sessions import events, sessions
from memq.workers.http.routes.state import state

ROUTERS = (sessions, events, memory, search_router, facts_router, state)
