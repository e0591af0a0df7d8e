"""The process machinery every worker kind runs on: one FastStream app and
one NATS connection per process (``app``), the dependencies it shares
among its components (``resources``), the ``Component`` base every kind is
(``component``), the registry of kinds (``kinds``), connecting
(``bus``), the owned JetStream batch consumer (``consumer``), leases, the
commit floor, dead letters, readiness, the health and metrics port, and the
collector's settings.

The runtime names no kind: kinds are registered by ``"module:Class"``
strings and imported only when a process runs them (an import-linter rule
holds this)."""
