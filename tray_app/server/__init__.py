"""The HTTP face: the OpenAI and Ollama routes, the control API and the guards in front."""
