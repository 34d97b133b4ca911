"""`python -m worker`: run a worker process (see worker.runner)."""

import sys

from worker.runner import main

sys.exit(main())
