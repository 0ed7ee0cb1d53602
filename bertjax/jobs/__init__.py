"""The job drivers `python -m bertjax.main` runs: `dispatch.run` picks pretraining (`pretrain`,
its run in `pretrain_run`) or fine-tuning to train (`finetune`, `finetune_run`), distill
(`distill`) or predict (`predict`), over the shared steps in `common` and `run_directory`. Imports
only the layers below it (settings, inference, finetune, train, model, data, parallel, core)."""
