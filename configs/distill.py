"""Knowledge distillation: a fine-tuned teacher run -> a smaller student of the same task and
labels (bertjax/finetune/distillation.py). By default the movie-review sentences, and a student
made of the teacher's embeddings and first 2 layers:

    python -m bertjax.main --config=configs/distill.py --workdir=STUDENT \
        --config.distill.teacher=TEACHER_WORKDIR [--config.distill.student_layers=K]

A preset student (trained from scratch on the teacher's vocabulary):
    --config.distill.student_layers=0 --config.model.preset=mini
or a pretrained one: --config.distill.student_layers=0 --config.init_checkpoint=PRETRAINED.

loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE; the
teacher's logits are computed once per training row before training. Other tasks as in their own
configs: e.g. --config.task=finetune_token_classification with the data of finetune_ner.py, or a
pair task with data.text_pair_column. The student is an ordinary fine-tuned run (export,
predict mode and bertjax.load(...).predict take it).
"""

import ml_collections

from configs import finetune_sentiment


def get_config():
    config = finetune_sentiment.get_config()
    config.distill = ml_collections.ConfigDict()
    config.distill.teacher = ""             # a fine-tuned run: workdir or params export
    config.distill.alpha = 0.5              # weight of the teacher's (soft) term, in [0, 1]
    config.distill.temperature = 2.0        # > 0; softens both distributions
    # K > 0: the student is the teacher's embeddings, first K layers and pooler (a fresh head);
    # 0: model.preset (from scratch) or config.init_checkpoint
    config.distill.student_layers = 2
    # A small student from the teacher's layers learns faster than BERT's 3e-5 suggests.
    config.optimizer.learning_rate = 1e-4
    return config
