from tray_app.cli import main

raise SystemExit(main())
