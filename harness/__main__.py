from harness.cli.commands import main

raise SystemExit(main())
