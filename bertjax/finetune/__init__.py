"""Fine-tuning: task heads on a pretrained encoder, readers, features, metrics and the trainer."""
