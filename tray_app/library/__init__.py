"""The models a service serves: the main one and the library's (configured or found in a folder)."""
