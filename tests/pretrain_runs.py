"""Tiny pretraining runs for the tests: the arguments of a 12-step run on the shared small corpus
(and of a 6-step one), and a child process that can crash itself at an exactly known point."""

import os
import subprocess
import sys
import textwrap


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_args(workdir, corpus_dir, **overrides):
    """A 12-step run: 32 tokens for steps 1-8, 64 tokens for steps 9-12."""
    settings = {
        "data.prepared": corpus_dir, "data.workers": 0, "train.steps": 12, "train.batch_size": 8,
        "schedule.short_seq_len": 32, "schedule.short_max_predictions": 5,
        "schedule.long_seq_len": 64, "schedule.long_max_predictions": 10,
        "schedule.long_fraction": 0.34, "train.log_every": 1, "train.checkpoint_every": 5,
        "train.eval_every": 6, "train.eval_batches": 2, "optimizer.warmup_steps": 3,
    }
    settings.update(overrides)
    return ["bertjax.cli.main", f"--config={REPO}/configs/tiny.py", f"--workdir={workdir}"] + [
        f"--config.{k}={v}" for k, v in settings.items()]


# With tiny_args: 6 steps of 32 tokens, checkpoints 3 and 6, no evaluation, every checkpoint kept.
SHORT = {"train.steps": 6, "train.checkpoint_every": 3, "train.eval_every": 0,
         "schedule.long_fraction": 0.0, "train.keep_checkpoints": 0}


# Runs the job in a child process; with KILL_AFTER_CHECKPOINT=N it SIGKILLs itself as soon as the
# checkpoint of step N is on disk, a crash at an exactly known point.
CHILD = textwrap.dedent("""
    import os, signal, sys
    from bertjax.train import checkpoint
    kill_at = int(os.environ.get("KILL_AFTER_CHECKPOINT", "0"))
    # "PID:N": once checkpoint N is complete, SIGSTOP process PID (a storage server that stops
    # answering at an exactly known point).
    stop_pid, _, stop_at = os.environ.get("STOP_PID_AFTER_CHECKPOINT", "0:0").partition(":")
    save = checkpoint.Checkpointer.save
    def save_then_maybe_die(self, step, state, data_state, **kwargs):
        result = save(self, step, state, data_state, **kwargs)
        if step == kill_at:
            self.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        if step == int(stop_at):
            self.wait()
            os.kill(int(stop_pid), signal.SIGSTOP)
        return result
    checkpoint.Checkpointer.save = save_then_maybe_die
    if os.environ.get("SIGTERM_DURING_COMPILE"):
        from bertjax.jobs import pretrain_fit
        compile_step = pretrain_fit.compile_step
        def compile_after_a_sigterm(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return compile_step(*args, **kwargs)
        pretrain_fit.compile_step = compile_after_a_sigterm
    from bertjax.cli import main
    sys.exit(main.main(sys.argv[1:]))
""")


# For the processes tests start: one CPU device (a plain single-device run) and the least backend
# optimization, since compiling, not running, dominates these tiny runs. XLA's CPU fusion emitters
# build an MLIR context per fusion: the older emitters compile such a step in half the time. The
# module is compiled in one piece, as in the workers (tests/conftest.py).
CHILD_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                   "--xla_cpu_parallel_codegen_split_count=1")


def child_env(**extra):
    env = dict(os.environ)
    env["XLA_FLAGS"] = CHILD_XLA_FLAGS
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_child(args, **env):
    return subprocess.run([sys.executable, "-c", CHILD, *args], env=child_env(**env),
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def run_cli(*args):
    """`python -m ARGS` in a child process with child_env()."""
    return subprocess.run([sys.executable, "-m", *args], env=child_env(), cwd=REPO,
                                capture_output=True, text=True, timeout=300)


def run_cli_afresh(*args):
    """run_cli in a freshly started interpreter, for a test whose point includes its start-up."""
    return subprocess.run([sys.executable, "-m", *args], env=child_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
