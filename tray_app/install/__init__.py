"""`failsoft install` and `failsoft uninstall`: for this user (`--user`: the menu entry, the systemd user
unit, the tray at login) or as a system service (`--system`: a dedicated user, a hardened systemd unit)."""
