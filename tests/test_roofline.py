"""The roofline's two halves on hand-written inputs (no compile): the HLO traffic estimate's
per-op rules (memory spaces, sliced and in-place fusion operands, views, a conditional's larger
branch), its categories, and the analytic minimum bytes of the bound."""

import types

import jax
import jax.numpy as jnp
import pytest

from bertjax.aot import hlo, hlo_traffic, report, topology, traffic_categories
from bertjax.aot.minimum_bytes import minimum_bytes
from bertjax.model.config import EncoderConfig
from bertjax.parallel.mesh import make_mesh

MIB = 2 ** 20

# A stacked weight (4 layers of 1 MiB) that a fusion slices one layer of, through a nested
# fusion; an in-place update of a stacked activation buffer (4 x 2 MiB); an operand in VMEM
# (S(1)); a view custom call; and a conditional whose branches move 4 and 12 MiB.
HLO = """HloModule m

%slice_layer (p0: f32[4,512,512], p1: s32[]) -> f32[512,512] {
  %p0 = f32[4,512,512]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = f32[1,512,512]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,512,512}
  ROOT %b = f32[512,512]{1,0} bitcast(%ds)
}

%matmul_and_save (q0: f32[4,512,512], q1: s32[], q2: f32[4,512,1024], q3: f32[512,512]) -> (f32[4,512,1024], f32[512,512]) {
  %q0 = f32[4,512,512]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %q2 = f32[4,512,1024]{2,1,0} parameter(2)
  %q3 = f32[512,512]{1,0:T(8,128)S(1)} parameter(3)
  %w = f32[512,512]{1,0} fusion(%q0, %q1), kind=kLoop, calls=%slice_layer
  %y = f32[512,512]{1,0} dot(%q3, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %z = s32[] constant(0)
  %u = f32[1,512,1024]{2,1,0} broadcast(%y), dimensions={}
  %dus = f32[4,512,1024]{2,1,0} dynamic-update-slice(%q2, %u, %q1, %z, %z)
  ROOT %t = (f32[4,512,1024]{2,1,0}, f32[512,512]{1,0:S(1)}) tuple(%dus, %y)
}

%small (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  ROOT %n = f32[1024]{0} negate(%a)
}

%big (c: f32[1024]) -> f32[1024] {
  %c = f32[1024]{0} parameter(0)
  %e = f32[1048576]{0} broadcast(%c), dimensions={}
  %m = f32[1048576]{0} negate(%e)
  ROOT %r = f32[1024]{0} slice(%m), slice={[0:1024]}
}

ENTRY %main (w: f32[4,512,512], i: s32[], acts: f32[4,512,1024], x: f32[512,512], flag: pred[]) -> f32[1024] {
  %w = f32[4,512,512]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %acts = f32[4,512,1024]{2,1,0} parameter(2)
  %x = f32[512,512]{1,0:T(8,128)S(1)} parameter(3)
  %flag = pred[] parameter(4)
  %f = (f32[4,512,1024]{2,1,0}, f32[512,512]{1,0:S(1)}) fusion(%w, %i, %acts, %x), kind=kOutput, calls=%matmul_and_save, metadata={op_name="jit(train_step)/jvp(M)/encoder/layer/dot_general"}
  %buffer = f32[4,512,1024]{2,1,0} custom-call(), custom_call_target="AllocateBuffer"
  %v = f32[1024]{0} iota(), iota_dimension=0
  ROOT %cond = f32[1024]{0} conditional(%flag, %v, %v), true_computation=%small, false_computation=%big
}
"""


def op(program: hlo.Program, name: str) -> int:
    return sum(o.bytes for o in program.ops if o.name == name)


def test_a_fusion_reads_the_slice_it_takes_and_writes_only_its_in_place_update():
    program = hlo.analyse(HLO)
    # Reads one 1 MiB layer of the 4 MiB weight, nothing of the 8 MiB buffer it updates in
    # place, nothing of its VMEM operand, the 4-byte index; writes the 2 MiB update, not its
    # VMEM result.
    assert op(program, "f") == 1 * MIB + 4 + 2 * MIB
    assert op(program, "buffer") == 0  # an allocation moves nothing
    # The matmul in the fusion: 2 x 512 x 512 x 512.
    assert program.matmul_flops == 2 * 512 ** 3


def test_the_estimate_takes_each_op_at_its_own_roofline_one_after_another():
    program = hlo.analyse(HLO)
    fusion, = [o for o in program.ops if o.name == "f"]
    assert fusion.flops == program.matmul_flops == 2 * 512 ** 3  # the fusion's matmul is its own
    assert sum(o.flops for o in program.ops) == program.matmul_flops
    chip = topology.CHIPS["v5e"]
    peak, bandwidth = chip.peak_bf16_tflops * 1e12, chip.hbm_gb_per_s * 1e9
    expected = max(fusion.flops / peak, fusion.bytes / bandwidth) + sum(
        o.bytes / bandwidth for o in program.ops if o.name != "f")
    assert report.ops_in_sequence_s(chip, program.ops) == pytest.approx(expected)
    # Never faster than the totals overlapped: each op waits for its slower half.
    assert expected >= max(program.matmul_flops / peak, program.traffic_bytes / bandwidth)


def test_a_conditional_counts_its_larger_branch_not_both():
    program = hlo.analyse(HLO)
    # The broadcast reads 4 KiB and writes 4 MiB, the negate reads and writes 4 MiB, the slice
    # reads and writes 4 KiB.
    big = 4096 + 4 * MIB + 8 * MIB + 2 * 4096
    assert op(program, "e") + op(program, "m") + op(program, "r") == big
    assert op(program, "n") == 0  # the smaller branch is not counted
    assert program.traffic_bytes == 3 * MIB + 4 + big


def test_arrays_in_on_chip_memory_spaces_are_not_hbm_bytes():
    assert hlo_traffic.hbm_bytes("(bf16[8]{0:T(8)S(1)}, f32[4]{0}, u32[]{:S(2)})") == 16
    assert hlo_traffic.shape_bytes("(bf16[8]{0:T(8)S(1)}, f32[4]{0}, u32[]{:S(2)})") == 36


@pytest.mark.parametrize("name, opcode, op_name, shapes, expected", [
    ("all-reduce.1", "all-reduce-start", "", "f32[768]", "collectives"),
    ("copy.3", "copy", "jit(s)/jvp(M)/encoder/layer/add", "bf16[32,128,768]", "copies_and_transposes"),
    ("multiply_add_fusion", "fusion", "jit(train_step)/add", "f32[768,768]", "optimizer_update"),
    ("fusion.1", "fusion", "jit(s)/transpose(jvp(M))/mlm/reduce_sum", "f32[32,20,768]", "mlm_head"),
    ("fusion.2", "fusion", "jit(s)/jvp(M)/encoder/while/body/layers/attention/btnd,bsnd->bnts/dot",
     "bf16[32,12,128,128]", "attention"),
    ("fusion.3", "fusion", "jit(s)/jvp(M)/encoder/while/body/layers/attention/query/dot",
     "bf16[4096,768] bf16[768,768]", "activations"),
    ("fusion.4", "fusion", "jit(s)/jvp(M)/encoder/while/body/dynamic_slice",
     "bf16[768,3072] f32[12,768,3072]", "weights"),
])
def test_traffic_categories(name, opcode, op_name, shapes, expected):
    found = hlo.OpBytes(name, opcode, op_name, shapes, 1)
    assert traffic_categories.category(found, frozenset((32, 4096))) == expected


def test_minimum_bytes_of_an_adamw_step():
    config = EncoderConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=2,
                           intermediate_size=256, dtype="bfloat16", remat="save_dots")
    params = {"w": jax.ShapeDtypeStruct((1000, 64), jnp.float32)}
    moments = {"mu": params["w"], "nu": params["w"], "count": jax.ShapeDtypeStruct((), jnp.int32)}
    state = types.SimpleNamespace(params=params, opt_state=moments)
    batch = {"input_ids": jax.ShapeDtypeStruct((8, 16), jnp.int32)}
    mesh = make_mesh(-1, 1, 1, devices=jax.devices()[:1])
    found = minimum_bytes(state, batch, config, mesh, seq_len=16)
    n = 64_000
    # AdamW in f32: parameters and two moments read and written: 24 bytes a parameter.
    assert found.hbm["optimizer_update"] == 24 * n
    assert found.hbm["batch"] == 8 * 16 * 4 and found.sequences == 8
    # Weights and activations may stay on chip: not in the bound, only beside it.
    assert found.hbm_total == 24 * n + 8 * 16 * 4
    assert found.spilled["weights"] == 2 * n * 2  # read twice, in bf16
    # save_dots keeps 6H + I elements a token a layer, in bf16, written and read once.
    assert found.spilled["activations"] == 2 * 2 * (8 * 16) * (6 * 64 + 256) * 2
    assert found.collective == 0  # one data shard: nothing to sum


def test_a_kernels_matmuls_are_the_analytic_counts_excess_when_the_hlo_calls_one():
    program = hlo.analyse(HLO)
    kernel = HLO.replace('custom_call_target="AllocateBuffer"',
                         'custom_call_target="tpu_custom_call"')

    def compiled(text):
        return types.SimpleNamespace(program=hlo.analyse(text),
                                     model_flops=8 * (program.matmul_flops + 10 ** 9))

    assert report.kernel_matmul_flops(compiled(HLO), chips=8) == 0.0
    assert report.kernel_matmul_flops(compiled(kernel), chips=8) == 10 ** 9
