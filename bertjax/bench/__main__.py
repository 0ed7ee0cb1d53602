import sys

from bertjax import host_memory

host_memory.reexec_with_huge_pages()  # before JAX or torch is imported

from bertjax.bench.cli import main  # noqa: E402

sys.exit(main())
