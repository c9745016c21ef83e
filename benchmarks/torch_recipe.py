"""A zoo net trained in PyTorch under one of minidl's default recipes: is a recipe target out of the
net's reach, or out of minidl's? GPU only.

    python -m benchmarks.torch_recipe --model resnet18 --epochs 5                       # -r18's recipe
    python -m benchmarks.torch_recipe --model lenet --dataset fashion-mnist --epochs 10 \\
        --optimizer adam --lr 3e-3 --weight-decay 2e-4                                # LeNet-5's there

The PyTorch twin (benchmarks/torch_models.py) starts from minidl's seeded initial weights; inputs
are normalised as minidl's loader does (mean 0.1307, std 0.3081, both datasets); the learning rate
follows a cosine to 0 over the run, per step; label smoothing as minidl's; `--shift s` moves each
image by up to s pixels in each direction (zero fill), as minidl's device augmentation. The batch
order is PyTorch's own (torch.randperm under the seed), not minidl's. Prints the test accuracy.

Time to accuracy, with minidl's stop rule (`minidl train --target-accuracy`, StopAtAccuracy):

    python -m benchmarks.torch_recipe --recipe fast --target-accuracy 99 --seed 0

scores the test set every --eval-every steps (a tenth of an epoch) and at the last step, stops at the
first that reaches the target, and prints one line `time to accuracy: {json}` (step, epoch, seconds of
training from the first step to that one, the device synchronised before each evaluation and the
evaluations left out, the first step's seconds, the evaluations' seconds). --recipe fast takes minidl's
named recipe (minidl/cli/recipes.py: batch, epochs, optimizer, lr, warm-up, smoothing, shifts); flags
given win. Data, model and optimizer state on the GPU; eager PyTorch, as users run it.
"""
import argparse
import json
import math
import sys
import time



def parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.torch_recipe", description=__doc__.split("\n")[0])
    # defaults None: --recipe's value where a flag is left out, else DEFAULTS'
    p.add_argument("--model", help="a zoo name with a PyTorch twin: lenet, resnet18, ... (resnet18)")
    p.add_argument("--dataset", default="mnist", choices=("mnist", "fashion-mnist"))
    p.add_argument("--epochs", type=int, help="epochs the schedule spans (5)")
    p.add_argument("-b", "--batch-size", type=int, help="batch size (32)")
    p.add_argument("--optimizer", choices=("momentum", "nesterov", "adam", "adamw"), help="optimizer (momentum)")
    p.add_argument("--lr", type=float, help="learning rate (0.025)")
    p.add_argument("--weight-decay", type=float, help="L2, added to the gradient (as minidl's) (0)")
    p.add_argument("--label-smoothing", type=float, help="label smoothing (0.1)")
    p.add_argument("--shift", type=int, help="shifts of up to this many pixels (0)")
    p.add_argument("--warmup", type=int, help="steps of linear warm-up, times the schedule (0)")
    p.add_argument("--schedule", choices=("cosine", "constant"), help="lr schedule over the run (cosine)")
    p.add_argument("--recipe", choices=("fast",), help="minidl's named recipe: its values where flags are left out")
    p.add_argument("--target-accuracy", type=float, metavar="PERCENT", help="stop at this test accuracy")
    p.add_argument("--eval-every", type=int, metavar="STEPS",
                   help="with --target-accuracy (the recipe's, else a tenth of an epoch)")
    p.add_argument("-x", dest="test_batch", type=int, help="test batch size (the recipe's, else 1000)")
    p.add_argument("--seed", type=int, default=0)
    return p


DEFAULTS = {"model": "resnet18", "epochs": 5, "batch_size": 32, "optimizer": "momentum", "lr": 0.025,
            "weight_decay": 0.0, "label_smoothing": 0.1, "shift": 0, "warmup": 0, "schedule": "cosine",
            "eval_every": None, "test_batch": 1000}


def resolve(args):
    """Each flag left out: the named recipe's value (minidl.cli.recipes.NAMED), else DEFAULTS'."""
    from minidl.cli import recipes
    recipe = recipes.NAMED[args.recipe] if args.recipe else {}
    for dest, default in DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, recipe.get(dest, default))
    return args


BLANK = -0.1307 / 0.3081          # a background pixel, normalised: what minidl fills shifted images with


def shifted(x, s, rows, cols):
    """Each image of x (N, 1, 28, 28) moved by its own random offset of up to s pixels, background fill."""
    import torch
    import torch.nn.functional as F
    if s == 0:
        return x
    n = x.shape[0]
    dy, dx = (torch.randint(0, 2 * s + 1, (n,), device=x.device) for _ in range(2))
    padded = F.pad(x, (s, s, s, s), value=BLANK)
    return padded[torch.arange(n, device=x.device)[:, None, None], 0,
                  (dy[:, None] + rows)[:, :, None], (dx[:, None] + cols)[:, None, :]].unsqueeze(1)


def main(argv=None):
    args = resolve(parser().parse_args(argv))
    import torch
    import torch.nn.functional as F

    from benchmarks.compare import copy_weights
    from benchmarks.torch_models import torch_model
    from minidl import models
    from minidl.data import load
    if not torch.cuda.is_available():
        print("torch_recipe: needs a GPU that PyTorch sees", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    depth = args.model.removeprefix("resnet") or "18"          # "resnet" alone: the zoo's ResNet-18
    case = {"model": "resnet", "depth": int(depth)} if depth.isdigit() else {"model": args.model}
    net = copy_weights(models.get(args.model, seed=args.seed), torch_model(case)).to(dev)

    def tensors(images, labels):
        x = ((torch.tensor(images, device=dev).float() / 255 - 0.1307) / 0.3081).unsqueeze(1)
        return x, torch.tensor(labels, device=dev).long()
    (x, y), (tx, ty) = tensors(*load(args.dataset, "train")), tensors(*load(args.dataset, "test"))

    per_epoch = len(x) // args.batch_size
    total = per_epoch * args.epochs
    if args.optimizer in ("adam", "adamw"):
        kind = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
        opt = kind(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay,
                              nesterov=args.optimizer == "nesterov")

    def factor(t):       # minidl's: the schedule from step 0, times a linear warm-up ramp (optim/schedules.py)
        f = (1 + math.cos(math.pi * min(t, total) / total)) / 2 if args.schedule == "cosine" else 1.0
        return f * min(1.0, (t + 1) / args.warmup) if args.warmup else f
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    grid = torch.arange(28, device=dev)

    def accuracy():
        net.eval()
        with torch.no_grad():
            b = args.test_batch
            predicted = torch.cat([net(tx[i:i + b]).argmax(1) for i in range(0, len(tx), b)])
        net.train()
        return float((predicted == ty).float().mean()) * 100

    target, every = args.target_accuracy, args.eval_every or max(per_epoch // 10, 1)
    step, evals, eval_s, first_s, reached, acc = 0, 0, 0.0, None, None, math.nan
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while step < total and reached is None:
        net.train()
        order = torch.randperm(len(x), device=dev)
        for k in range(per_epoch):
            idx = order[k * args.batch_size:(k + 1) * args.batch_size]
            loss = F.cross_entropy(net(shifted(x[idx], args.shift, grid, grid)), y[idx],
                                   label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            step += 1
            if first_s is None:
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
            if target is not None and (step % every == 0 or step == total):
                torch.cuda.synchronize()                  # the steps so far are training's
                t = time.perf_counter()
                acc = accuracy()
                eval_s, evals = eval_s + time.perf_counter() - t, evals + 1
                if acc >= target:
                    reached = step
                    break
            if step == total:
                break
    torch.cuda.synchronize()
    train_s = time.perf_counter() - t0 - eval_s
    if target is None:
        acc = accuracy()
        print(f"PyTorch {args.model} on {args.dataset}, {args.epochs} epochs, seed {args.seed}: "
              f"{acc:.2f}% ({train_s:.0f} s)")
        return 0
    print("time to accuracy: " + json.dumps({
        "framework": "pytorch", "seed": args.seed, "target": target, "reached": reached is not None,
        "step": reached, "epoch": None if reached is None else reached / per_epoch, "accuracy": acc,
        "train_s": train_s, "first_s": first_s, "eval_s": eval_s, "evaluations": evals,
        "batch_size": args.batch_size}))
    return 0 if reached is not None else 1


if __name__ == "__main__":
    sys.exit(main())
