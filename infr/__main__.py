from infr.cli import main

raise SystemExit(main())
