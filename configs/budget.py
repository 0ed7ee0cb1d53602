"""The best encoder this machine pretrains in a fixed wall-clock budget: 60 minutes by default,
on real English prose (Wikipedia and public-domain books), on 2 CPU cores or whatever runs it.

    python -m bertjax.main --config=configs/budget.py --workdir=runs/budget \
        [--config.train.time_budget_minutes=60]

Its corpus, demo:books+wiki, has books from Debian 12's packages (apt-get fetches them); where
apt-get cannot, --config.data.input=demo:bible+wiki is the corpus that needs only pip.

Learned from cramming (Geiping & Goldstein, 2022: MLM only, no NSP, short sequences, no dropout,
a one-cycle schedule over the budget, predictions only at the masked positions, which bertjax's
step always gathers) and from ModernBERT (a higher masking rate). The model stays BERT's
architecture so Hugging Face's BertForMaskedLM is the same model (the peer of
benchmarks/budget_pretraining.py). The choices measured are in docs/pretraining_pays.md
(`python benchmarks/budget_recipe.py`).
"""

from configs import base


def get_config():
    config = base.get_config()
    config.objective = "roberta"  # MLM on full sentences: NSP costs steps and buys nothing
    config.data.input = "demo:books+wiki"
    config.data.vocab_size = 8192
    config.data.eval_fraction = 0.02
    config.model.preset = "mini"
    config.model.hidden_dropout = 0.0  # one pass over part of the corpus: nothing to overfit
    config.model.attention_dropout = 0.0
    config.masking.mask_prob = 0.3
    # 128 tokens (base.py's short phase) only: ceil(128 x 0.3) predictions, the rate unclipped.
    config.schedule.short_max_predictions = 39
    config.schedule.long_fraction = 0.0
    config.train.time_budget_minutes = 60.0
    # train.steps (base.py's 1,000,000) is only a cap: the budget ends the run.
    config.train.batch_size = 32
    config.train.log_every = 50
    config.train.checkpoint_every = 1_000_000
    config.train.checkpoint_every_minutes = 15.0  # the 15 / 30 / 45-minute points of the curve
    config.train.keep_checkpoints = 0
    config.train.eval_every = 500
    config.train.eval_batches = 16
    config.train.plot = True
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 100_000  # 10% of train.steps: the first 10% of the budget
    config.optimizer.b2 = 0.98
    config.optimizer.bias_correction = True
    return config
