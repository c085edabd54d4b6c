"""`failsoft doctor`: the checks, the desktop tray probe and the command."""
