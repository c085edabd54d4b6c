"""The worker subprocess (`python -m tray_app.worker`): llama-cpp-python's OpenAI server for one model, plus a
/health that never waits for the model, a simulated-GPU budget, and fault injection for drills."""
