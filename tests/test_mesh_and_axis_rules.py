"""Mesh construction and the logical-axis rules (8 fake CPU devices from conftest)."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bertjax.core.errors import UserError
from bertjax.parallel import mesh as mesh_lib
from bertjax.parallel import partitioning
from bertjax.settings.shared import mesh_settings


def test_make_mesh_fills_the_free_axis():
    mesh = mesh_lib.make_mesh(data=-1, fsdp=2, tensor=1)
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    assert mesh_lib.make_mesh(2, -1, 2).shape["fsdp"] == 2
    one = mesh_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    assert one.devices.size == 1


@pytest.mark.parametrize("sizes, message", [
    ((3, 1, 1), "needs 3 devices but there are 8"),
    ((-1, 3, 1), "multiply to 3"),
    ((-1, -1, 1), "at most one"),
    ((0, 1, 8), "positive or -1"),
    ((-2, 1, 8), "positive or -1"),
])
def test_bad_mesh_sizes_are_user_errors(sizes, message):
    with pytest.raises(UserError, match=message):
        mesh_lib.make_mesh(*sizes)


def test_the_mesh_spans_the_first_devices_mesh_devices_names():
    two = mesh_settings(ml_collections.ConfigDict(
        {"data": -1, "fsdp": 1, "tensor": 1, "devices": 2})).make()
    assert dict(two.shape) == {"data": 2, "fsdp": 1, "tensor": 1}
    assert list(two.devices.flat) == jax.devices()[:2]
    assert mesh_lib.first_devices(-1) == jax.devices()
    assert mesh_lib.first_devices(3, jax.devices()[4:]) == jax.devices()[4:7]


@pytest.mark.parametrize("devices, message", [
    (9, "mesh.devices=9: there are 8 devices"), (0, "mesh.devices must be"),
    (-2, "mesh.devices must be"), (True, "mesh.devices must be"), (2.0, "mesh.devices must be")])
def test_bad_mesh_devices_are_user_errors(devices, message):
    section = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1, "devices": devices})
    with pytest.raises(UserError, match=message):
        mesh_settings(section).make()


def test_a_run_over_several_processes_uses_every_device():
    hosts = [types.SimpleNamespace(process_index=i // 4) for i in range(8)]
    assert mesh_lib.first_devices(-1, hosts) == hosts
    with pytest.raises(UserError, match="several processes uses every device"):
        mesh_lib.first_devices(4, hosts)


def test_rules_shard_params_on_fsdp_and_activations_on_batch():
    rules = partitioning.RULES
    # "fsdp" appears twice in the rules; in one spec flax uses it only for the first match.
    assert nn.logical_to_mesh_axes(("batch", "length", "embed"), rules) == P(
        ("data", "fsdp"), None, None)
    assert nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"), rules) == P(
        ("data", "fsdp"), None, "tensor", None)
    assert nn.logical_to_mesh_axes(("vocab", "embed"), rules) == P("tensor", "fsdp")
    assert nn.logical_to_mesh_axes(("embed", "mlp"), rules) == P("fsdp", "tensor")
    assert nn.logical_to_mesh_axes(("layers", "embed", "heads", "kv"), rules) == P(
        None, "fsdp", "tensor", None)
    assert nn.logical_to_mesh_axes(("norm",), rules) == P(None)


class _Toy(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.normal(0.02)
        table = self.param("embedding", nn.with_logical_partitioning(init, ("vocab", "embed")),
                           (6, 16))
        odd = self.param("odd", nn.with_logical_partitioning(init, ("vocab", "embed")), (5, 16))
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                           (16,))
        hidden = nn.with_logical_constraint(table[x] * scale, ("batch", "length", "embed"))
        return hidden.sum() + odd.sum()


def test_param_shardings_follow_rules_and_keep_uneven_dims_whole():
    mesh = mesh_lib.make_mesh(2, 2, 2)
    x = jnp.zeros((4, 3), jnp.int32)
    boxed = jax.eval_shape(_Toy().init, jax.random.PRNGKey(0), x)
    shardings = partitioning.param_shardings(boxed, mesh)
    params = shardings["params"]
    assert params["embedding"].spec == P("tensor", "fsdp")
    assert params["odd"].spec == P(None, "fsdp")  # 5 rows do not split over 2 tensor shards
    assert params["scale"].spec == P(None)
    assert jax.tree.structure(shardings) == jax.tree.structure(nn.meta.unbox(boxed))


def test_axis_rules_apply_activation_constraints_inside_jit():
    mesh = mesh_lib.make_mesh(2, 2, 2)

    def forward(x):
        with partitioning.axis_rules(mesh):
            return nn.with_logical_constraint(x * 2, ("batch", "length", "embed"))

    text = jax.jit(forward).lower(jnp.zeros((8, 4, 16))).as_text()
    assert 'sharding_constraint' in text and '[{"data", "fsdp"}, {}, {}]' in text
    # Without the rules active the constraint is a no-op.
    plain = jax.jit(lambda x: nn.with_logical_constraint(x * 2, ("batch", "length", "embed")))
    assert "sharding_constraint" not in plain.lower(jnp.zeros((8, 4, 16))).as_text()


def test_global_batch_shards_the_leading_axis():
    mesh = mesh_lib.make_mesh(2, 2, 2)
    local = {"input_ids": np.arange(8 * 5, dtype=np.int32).reshape(8, 5),
             "nsp_label": np.arange(8, dtype=np.int32)}
    batch = partitioning.global_batch(local, mesh)
    assert batch["input_ids"].sharding.spec == P(("data", "fsdp"))
    assert batch["input_ids"].sharding.is_equivalent_to(partitioning.batch_sharding(mesh), 2)
    assert len(batch["input_ids"].addressable_shards) == 8
    assert batch["input_ids"].addressable_shards[0].data.shape == (2, 5)
    np.testing.assert_array_equal(np.asarray(batch["input_ids"]), local["input_ids"])
    np.testing.assert_array_equal(np.asarray(batch["nsp_label"]), local["nsp_label"])
    assert partitioning.replicated(mesh).spec == P()


def test_global_batch_rejects_indivisible_or_ragged_batches():
    mesh = mesh_lib.make_mesh(2, 2, 2)
    with pytest.raises(UserError, match="not divisible"):
        partitioning.global_batch({"input_ids": np.zeros((6, 5), np.int32)}, mesh)
    with pytest.raises(UserError, match="different numbers of rows"):
        partitioning.global_batch({"a": np.zeros((8, 5)), "b": np.zeros((4,))}, mesh)
