"""`python -m trainctl.worker`: run a worker process (see worker.runner)."""

import sys

from trainctl.worker.runner import main

sys.exit(main())
