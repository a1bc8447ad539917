"""Which worker gets a request: discovery, health, load, prefix affinity, dispatch."""
