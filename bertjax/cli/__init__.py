"""Every command-line entry point, one module each, over one shared plumbing (`entry`). The
documented `python -m bertjax.X` modules are thin shims that run a module of this package.
Nothing here changes the process a command runs in.
"""
