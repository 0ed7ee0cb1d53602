"""Every command-line entry point, one module each, over one shared plumbing. The documented
`python -m bertjax.X` modules are thin shims that call into here."""
