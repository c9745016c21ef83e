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
"""
import argparse
import math
import sys
import time


def parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.torch_recipe", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18", help="a zoo name with a PyTorch twin: lenet, resnet18, ...")
    p.add_argument("--dataset", default="mnist", choices=("mnist", "fashion-mnist"))
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--optimizer", default="momentum", choices=("momentum", "nesterov", "adam"))
    p.add_argument("--lr", type=float, default=0.025)
    p.add_argument("--weight-decay", type=float, default=0.0, help="L2, added to the gradient (as minidl's)")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--shift", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    return p


def shifted(x, s, rows, cols):
    """Each image of x (N, 1, 28, 28) moved by its own random offset of up to s pixels, zero fill."""
    import torch
    import torch.nn.functional as F
    if s == 0:
        return x
    n = x.shape[0]
    dy, dx = (torch.randint(0, 2 * s + 1, (n,), device=x.device) for _ in range(2))
    padded = F.pad(x, (s, s, s, s))
    return padded[torch.arange(n, device=x.device)[:, None, None], 0,
                  (dy[:, None] + rows)[:, :, None], (dx[:, None] + cols)[:, None, :]].unsqueeze(1)


def main(argv=None):
    args = parser().parse_args(argv)
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
    if args.optimizer == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay,
                              nesterov=args.optimizer == "nesterov")
    cosine = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: (1 + math.cos(math.pi * min(t, total) / total)) / 2)
    grid = torch.arange(28, device=dev)
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        net.train()
        order = torch.randperm(len(x), device=dev)
        for k in range(per_epoch):
            idx = order[k * args.batch_size:(k + 1) * args.batch_size]
            loss = F.cross_entropy(net(shifted(x[idx], args.shift, grid, grid)), y[idx],
                                   label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            cosine.step()
    net.eval()
    with torch.no_grad():
        predicted = torch.cat([net(tx[i:i + 1000]).argmax(1) for i in range(0, len(tx), 1000)])
    accuracy = float((predicted == ty).float().mean()) * 100
    print(f"PyTorch {args.model} on {args.dataset}, {args.epochs} epochs, seed {args.seed}: "
          f"{accuracy:.2f}% ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
