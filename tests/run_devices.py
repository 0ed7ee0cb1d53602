"""How many of the suite's 8 CPU devices a training run inside a test worker spans.

Two: the run is still data parallel (each batch split over the devices, the gradients reduced
across them), but over all 8 a tiny fine-tuning run spends a fifth of its CPU on the six extra
devices' threads and collectives. test_regression_learns alone took 17.1-17.3 s of user CPU
over 8 devices and 13.9-14.3 s over 2. test_finetune, test_adapters_lora, test_cloze_prompt and
test_span_classification on two workers took 185-186 s of user CPU (118 s of wall time) over 8
and 159-163 s (98-100 s) over 2, the runs alternated.

The 8 buy no coverage: the 8-device meshes (data, fsdp, tensor and mixed) are each tested step
by step against one device (test_sharded_steps.py, test_step.py, test_electra.py,
test_mesh_and_axis_rules.py), and a run over all of them by test_multihost.py's reference.
"""

IN_A_WORKER = {"mesh.devices": 2}
