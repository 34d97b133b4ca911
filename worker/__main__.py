"""`python -m trainctl.worker`: run a worker process (see worker.runner).

`trainctl worker` is the same, isolated (store/processes.py). Started with `python -m`, the
working folder is first on `sys.path`: it is taken off before anything else is imported, so
that a `torch/` there is never imported.
"""

import os
import sys

# Before any other import (see above): `python -m` put the working folder first.
if not sys.flags.safe_path and sys.path and sys.path[0] == os.getcwd():
    del sys.path[0]

# Guarded, and the import inside: a prepare's tokenizing processes are spawned, and a spawned
# process runs this module again (as __mp_main__) before its task. It must neither start a
# second worker nor import torch for nothing.
if __name__ == "__main__":
    from trainctl.worker.runner import main

    sys.exit(main())
