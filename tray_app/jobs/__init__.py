"""The job engine: a request's life from admission to its one final state, apart from HTTP."""
