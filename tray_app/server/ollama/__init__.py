"""Ollama's native API (`/api/chat`, `/api/generate`, `/api/tags`, ...) on the service's own port, translated
to and from the OpenAI routes so that everything that generates goes through the same router."""
