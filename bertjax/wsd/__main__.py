import sys

from bertjax.wsd.cli import main

main(sys.argv[1:])
