from gearhorn.cli import main

raise SystemExit(main())
