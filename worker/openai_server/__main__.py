"""`python -m worker.openai_server`: the same as `kvroute engine`."""

import sys

from worker.openai_server.main import main

sys.exit(main())
