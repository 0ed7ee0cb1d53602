"""bertjax: pretraining and fine-tuning BERT-style encoders with JAX and Flax.

    import bertjax
    model = bertjax.load(PATH)    # see bertjax.inference.api
    except bertjax.UserError: ...  # bad arguments, named (a ValueError)
"""

from bertjax.core.errors import UserError  # what the API raises for bad arguments (a ValueError)
from bertjax.core.platforms import keep_off_absent_accelerators

__version__ = "0.1.0"


def load(path: str, **options):
    """A trained encoder ready to use (`bertjax.inference.api.Model`); see `bertjax.inference.api.load`."""
    from bertjax.inference.api import load as _load  # deferred: `import bertjax` stays cheap (no JAX)

    keep_off_absent_accelerators()  # JAX is imported by now: its setting, not the environment, is set
    return _load(path, **options)
