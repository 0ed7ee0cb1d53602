"""`python -m bertjax.index build|search|evaluate ...`: see bertjax.retrieval.cli."""

import sys

from bertjax.retrieval.cli import main

if __name__ == "__main__":
    main(sys.argv[1:])
