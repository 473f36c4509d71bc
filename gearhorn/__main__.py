from gearhorn.cli.main import main

raise SystemExit(main())
