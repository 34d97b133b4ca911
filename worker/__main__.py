"""`python -m trainctl.worker`: run a worker process (see worker.runner)."""

import sys

# Guarded, and the import inside: a prepare's tokenizing processes are spawned, and a spawned
# process runs this module again (as __mp_main__) before its task. It must neither start a
# second worker nor import torch for nothing.
if __name__ == "__main__":
    from trainctl.worker.runner import main

    sys.exit(main())
