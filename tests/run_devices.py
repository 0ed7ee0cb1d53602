"""How many of the suite's 8 CPU devices a training run inside a test worker spans.

Two: the run is still data parallel (each batch split over the devices, the gradients reduced
across them), but over all 8 a tiny fine-tuning run spends a fifth of its CPU on the six extra
devices' threads and collectives.

The 8 buy no coverage: the 8-device meshes (data, fsdp, tensor and mixed) are each tested step
by step against one device (test_sharded_steps.py, test_step.py, test_electra.py,
test_mesh_and_axis_rules.py), and a run over all of them by test_multihost.py's reference.
"""

IN_A_WORKER = {"mesh.devices": 2}
