"""The model's tokenizer, chat template and grammar parser, in a helper process of their own.

They are llama.cpp's native code reading client input (a nested grammar overflows its recursive parser's
stack; a CUDA build of the binding initialises a driver): the service that owns the jobs, the journal and
the workers never loads them. `counter` is the native side (run by `helper`, and by tests); `process` and
`model_tokens` are the service's side, which speaks to the helper over a socket (`wire`).
"""
