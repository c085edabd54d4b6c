"""The engine (llama-cpp-python with llama.cpp's `llama-server`, one compile): `failsoft engine build`, `use`
and `status`. `build` is standard library only: a checkout runs it before Failsoft is installed."""
