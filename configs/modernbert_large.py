"""ModernBERT-large (Warner et al., 2024): 28 layers, H=1,024, 16 heads, GeGLU 2 x 2,624; the
rest as configs/modernbert.py, with the paper's lower peak learning rate."""

from configs import modernbert


def get_config():
    config = modernbert.get_config()
    config.model.preset = "modernbert_large"
    config.optimizer.learning_rate = 5e-4
    return config
