import sys

from bertjax.bench.cli import main

sys.exit(main())
