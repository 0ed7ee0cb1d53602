"""The foundations every layer may use: errors and exit statuses, files written whole (atomic
files, staged output directories, file modes), registry data shipped in packages, length buckets
for static shapes, quiet library logs and the process's host-memory set-up. Imports nothing of
bertjax above it."""
