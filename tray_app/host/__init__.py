"""The composition root and the process: wiring the parts, the service thread, `failsoft serve`."""
