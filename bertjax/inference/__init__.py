"""Using a trained encoder: the one loader (`loading`: a workdir, a params export or a Hugging
Face directory), a fine-tuned run's predictions (`prediction`, what predict mode and the API
share) and the Python API on top of them (`api`: `bertjax.load(PATH)` -> Model, its arguments
checked by `arguments`, run by `runner`)."""
