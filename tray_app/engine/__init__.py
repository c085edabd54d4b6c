"""llama.cpp's own `llama-server` as the worker engine: where the binary is, what it is started with, what it
says when it fails, and the faults drills produce in it."""

WORKER_KEY_ENV = "FAILSOFT_WORKER_KEY"  # a harness that starts the service sets the key its workers take
