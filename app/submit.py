"""Entry file for ``spark-submit``: the same CLI, so the same job, settings and checks.

    spark-submit --master local[2] --jars "$(infra/spark-jars.sh)" app/submit.py run --available-now

Under spark-submit the master, jars and driver memory come from its command line; everything
else (Delta, state store, settings) is set up exactly as for ``adattr run``.
"""

from __future__ import annotations

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
