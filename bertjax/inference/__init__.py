"""Using a trained encoder: the one loader (`loading`: a workdir, a params export or a Hugging
Face directory) and the Python API on top of it (`api`: `bertjax.load(PATH)` -> Model)."""
