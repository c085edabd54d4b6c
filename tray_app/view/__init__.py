"""What the tray and `failsoft status` show, worked out from the service's answers as plain data: no Qt here,
so the tray (`ui/`) and the terminal (`console/`) share it and it is tested without a display."""
