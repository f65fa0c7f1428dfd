"""Entry point of one rank: ``python -m memdiag.agent CONFIG`` (started by mpirun)."""

from memdiag.agent.main import main

raise SystemExit(main())
