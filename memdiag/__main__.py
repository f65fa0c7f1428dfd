from memdiag.cli import main

raise SystemExit(main())
