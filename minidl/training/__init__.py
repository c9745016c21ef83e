"""The training loop: `Trainer` (trainer.py), one step, eager or captured (step.py), the
loop's seam (callbacks.py), fp16 loss scaling (loss_scale.py), what a run shows (progress.py)."""
