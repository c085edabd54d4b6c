"""The VRAM budget: the model's sizes, the device, the planner and llama.cpp's own numbers."""
