"""Checkpoint faults injected for real: damaged files, NaN states, retention, a full disk."""

import glob
import math
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.model.config import preset
from bertjax.model.heads import BertForPretraining
from bertjax.parallel.mesh import make_mesh
from bertjax.train.checkpoint import Checkpointer, latest_step
from bertjax.train.metrics_log import NonFiniteLossError
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import abstract_train_state, create_train_state

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = {"input_ids": jax.ShapeDtypeStruct((8, 16), jnp.int32),
          "segment_ids": jax.ShapeDtypeStruct((8, 16), jnp.int32),
          "input_mask": jax.ShapeDtypeStruct((8, 16), jnp.int32),
          "masked_positions": jax.ShapeDtypeStruct((8, 4), jnp.int32),
          "masked_ids": jax.ShapeDtypeStruct((8, 4), jnp.int32),
          "masked_weights": jax.ShapeDtypeStruct((8, 4), jnp.float32),
          "nsp_label": jax.ShapeDtypeStruct((8,), jnp.int32)}


def tiny_model(vocab_size=128):
    return BertForPretraining(preset("tiny", vocab_size=vocab_size, max_position_embeddings=32))


@pytest.fixture(scope="module")
def bert():
    """A tiny BertForPretraining train state (one device: compiling dominates), its abstract."""
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = make_optimizer(OptimizerConfig(learning_rate=1e-3, warmup_steps=0,
                                               total_steps=10))
    state, _ = create_train_state(tiny_model(), optimizer, SHAPES, mesh, seed=0)
    abstract, _ = abstract_train_state(tiny_model(), optimizer, SHAPES, mesh, seed=0)
    later = state.replace(step=state.step + 20,
                          params=jax.tree.map(lambda x: x + 1, state.params))
    other_vocab, _ = abstract_train_state(tiny_model(256), optimizer, SHAPES, mesh, seed=0)
    return {"state": state, "later": later, "abstract": abstract, "other_vocab": other_vocab,
            "optimizer": optimizer}


@pytest.fixture(scope="module")
def pristine(bert, tmp_path_factory):
    """A workdir holding checkpoints 10 (`state`) and 20 (`later`), never modified itself."""
    workdir = str(tmp_path_factory.mktemp("pristine") / "wd")
    with Checkpointer(workdir) as checkpointer:
        checkpointer.save(10, bert["state"], {"position": 10})
        checkpointer.save(20, bert["later"], {"position": 20})
    return workdir


@pytest.fixture
def workdir(pristine, tmp_path):
    copy = str(tmp_path / "wd")
    shutil.copytree(pristine, copy)
    return copy


def step_dir(workdir, step):
    return os.path.join(workdir, "checkpoints", str(step))


def truncate_array_data(workdir, step):
    """Cuts the largest array file of the step's OCDBT store in half."""
    files = glob.glob(os.path.join(step_dir(workdir, step), "state", "**", "d", "*"),
                      recursive=True)
    biggest = max(files, key=os.path.getsize)
    os.truncate(biggest, os.path.getsize(biggest) // 2)


def garble_data_item(workdir, step):
    for path in glob.glob(os.path.join(step_dir(workdir, step), "data", "*")):
        with open(path, "w") as f:
            f.write("\x00garbage{{{")


def delete_state_item(workdir, step):
    shutil.rmtree(os.path.join(step_dir(workdir, step), "state"))


def assert_same(got, want):
    got_leaves = jax.tree_util.tree_leaves_with_path(got)
    assert len(got_leaves) == len(jax.tree.leaves(want))
    for (path, a), b in zip(got_leaves, jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), jax.tree_util.keystr(path))


def listing(workdir):
    return sorted(os.listdir(os.path.join(workdir, "checkpoints")))


@pytest.mark.parametrize("damage", [truncate_array_data, garble_data_item, delete_state_item])
@pytest.mark.slow
def test_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_used(
        bert, workdir, damage, capsys):
    damage(workdir, 20)
    checkpointer = Checkpointer(workdir, keep=None)
    step, state, data = checkpointer.restore_latest(bert["abstract"])
    assert (step, data) == (10, {"position": 10})
    assert_same(state, bert["state"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("checkpoint 20 is unreadable (")
    assert lines[0].endswith("); resuming from 10") and len(lines[0]) < 250
    assert listing(workdir) == ["10", "20.unreadable"]
    # The run goes on: step 20 is saved again, not blocked by the damaged copy.
    assert checkpointer.save(20, bert["later"], {"position": 20})
    checkpointer.close()
    assert listing(workdir) == ["10", "20", "20.unreadable"]
    assert latest_step(workdir) == 20


@pytest.mark.slow
def test_checkpoint_of_another_model_is_refused_and_nothing_moves(bert, workdir):
    with Checkpointer(workdir) as checkpointer:
        with pytest.raises(UserError, match="made with another model shape or vocabulary"):
            checkpointer.restore_latest(bert["other_vocab"])
    assert listing(workdir) == ["10", "20"]


def test_when_nothing_restores_one_line_names_each_and_both_are_kept(bert, workdir):
    truncate_array_data(workdir, 20)
    garble_data_item(workdir, 10)
    with Checkpointer(workdir) as checkpointer:
        with pytest.raises(UserError) as failed:
            checkpointer.restore_latest(bert["abstract"])
    message = str(failed.value)
    assert message.startswith(f"no checkpoint in {workdir}/checkpoints restores: checkpoint 20: ")
    assert "; checkpoint 10: " in message and "\n" not in message
    assert listing(workdir) == ["10.unreadable", "20.unreadable"]


def test_read_only_use_passes_over_damage_without_moving_it(bert, workdir, capsys):
    delete_state_item(workdir, 20)
    assert latest_step(workdir) == 20
    with Checkpointer(workdir, read_only=True) as checkpointer:
        with pytest.raises(UserError, match="checkpoint 20 in .* is unreadable"):
            checkpointer.restore(20, bert["abstract"])
        step, _, _ = checkpointer.restore_latest(bert["abstract"])
        assert step == 10 and checkpointer.latest_step() == 10
    assert capsys.readouterr().err.strip().endswith("); using 10")
    assert listing(workdir) == ["10", "20"]


def test_non_finite_state_or_loss_is_never_saved(bert, workdir):
    nan_params = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan), bert["later"].params)
    with Checkpointer(workdir, keep=1) as checkpointer:
        with pytest.raises(NonFiniteLossError,
                           match="^parameters became non-finite by step 30$") as bad_params:
            checkpointer.save(30, bert["later"].replace(params=nan_params), {"position": 30})
        assert bad_params.value.first_bad_checkpoint == 30
        with pytest.raises(NonFiniteLossError,
                           match="^the loss became non-finite by step 30$") as bad_loss:
            checkpointer.save(30, bert["later"], {}, metrics={"loss": jnp.float32(math.inf)})
        assert bad_loss.value.first_bad_checkpoint == 29  # the parameters that produced it
        assert listing(workdir) == ["10", "20"]
        assert checkpointer.save(30, bert["later"], {"position": 30},
                                 metrics={"loss": jnp.float32(2.5)})
    # keep=1 counts proven checkpoints only: 20 (proven by step 30's finite loss) stays, and 30
    # stays until a later loss proves it.
    assert listing(workdir) == ["20", "30"]


def test_retention_keeps_the_newest_proven_checkpoint_and_a_divergence_sets_aside_the_rest(
        tmp_path):
    """Finite but exploded parameters (saved at 3, their loss at 4 is inf) never push the last
    proven checkpoint out, and the divergence renames them `3.diverged`."""
    workdir = str(tmp_path / "wd")
    tree = {"w": jnp.arange(4.0)}
    with Checkpointer(workdir, keep=1, async_save=False) as checkpointer:
        checkpointer.save(1, tree, {}, metrics={"loss": jnp.float32(3.0)})
        checkpointer.save(2, tree, {}, metrics={"loss": jnp.float32(2.0)})
        assert listing(workdir) == ["1", "2"]
        checkpointer.save(3, {"w": tree["w"] * 1e30}, {}, metrics={"loss": jnp.float32(1.0)})
        assert listing(workdir) == ["2", "3"]
        with pytest.raises(NonFiniteLossError) as diverged:
            checkpointer.save(4, tree, {}, metrics={"loss": jnp.float32(math.inf)})
        said = checkpointer.set_aside_diverged(diverged.value.first_bad_checkpoint)
    assert said == ("checkpoint 3 set aside as <step>.diverged; "
                    "the newest good checkpoint is step 2")
    assert listing(workdir) == ["2", "3.diverged"]
    with Checkpointer(workdir) as again:
        assert again.restore_latest(jax.eval_shape(lambda: tree))[0] == 2
    # A stop's save (no loss) proves nothing: keep=2 with one proven keeps all three.
    other = str(tmp_path / "stops")
    with Checkpointer(other, keep=2, async_save=False) as checkpointer:
        checkpointer.save(1, tree, {})
        checkpointer.save(2, tree, {})
        checkpointer.save(3, tree, {}, metrics={"loss": jnp.float32(1.0)})
        checkpointer.save(4, tree, {}, metrics={"loss": jnp.float32(1.0)})
    assert listing(other) == ["2", "3", "4"]


def test_keep_zero_or_none_keeps_every_checkpoint(tmp_path):
    tree = {"w": jnp.arange(4.0)}
    for keep in (0, None):
        workdir = str(tmp_path / f"keep-{keep}")
        with Checkpointer(workdir, keep=keep, async_save=False) as checkpointer:
            for step in range(1, 6):
                checkpointer.save(step, tree, {})
        assert listing(workdir) == ["1", "2", "3", "4", "5"]
    with pytest.raises(UserError, match="keep=-1"):
        Checkpointer(str(tmp_path / "negative"), keep=-1)
    assert not os.path.exists(tmp_path / "negative")


# Saves checkpoint 5 onto a 200 KiB tmpfs, then checkpoint 10, which does not fit.
FULL_DISK = textwrap.dedent("""
    import os, sys
    import jax, jax.numpy as jnp, numpy as np
    from bertjax.core.errors import UserError
    from bertjax.train.checkpoint import Checkpointer
    workdir = sys.argv[1]
    rng = np.random.default_rng(0)
    tree = {"w": jnp.asarray(rng.normal(size=(256, 64)).astype(np.float32))}
    checkpointer = Checkpointer(workdir, keep=1)
    checkpointer.save(5, tree, {"position": 5})
    checkpointer.wait()
    try:
        checkpointer.save(10, {"w": tree["w"] + 1}, {"position": 10})
        checkpointer.wait()
    except UserError as e:
        print(type(e).__name__, e)
    checkpointer.close()
    print(sorted(os.listdir(os.path.join(workdir, "checkpoints"))))
    with Checkpointer(workdir) as again:
        step, state, data = again.restore_latest(jax.eval_shape(lambda: tree))
    print(step, data, bool(np.array_equal(state["w"], tree["w"])))
""")


def test_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path):
    mount_point = str(tmp_path / "small-disk")
    os.makedirs(mount_point)
    # A private mount namespace: the tmpfs disappears with the process, even if it crashes.
    namespace = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        namespace[1:1] = ["--user", "--map-root-user"]
    script = (f"mount -t tmpfs -o size=200k tmpfs {mount_point} && "
              f'exec "{sys.executable}" -c "$0" {mount_point}/wd')
    env = {**os.environ, "PYTHONPATH": REPO, "XLA_FLAGS": ""}
    result = subprocess.run([*namespace, "sh", "-c", script, FULL_DISK], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"CheckpointWriteError cannot write checkpoint 10 to "
                               f"{mount_point}/wd/checkpoints: No space left on device (")
    assert lines[0].endswith(" KiB free)")
    assert lines[1:] == ["['5']", "5 {'position': 5} True"]
    assert "Traceback" not in result.stderr and "ERROR" not in result.stderr, result.stderr
