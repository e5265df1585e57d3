"""scripts/plot_compare.py DIR [OUT.png] — gridgpt beside PyTorch (docs/compare-torch.md), from the logs
that scripts/compare_torch.py's recipe leaves in DIR:
    gridgpt_seedS.log  ./train_cpu's            torch_seedS.log  scripts/compare_torch.py train's
    torch_gridgpt-init_seedS.log (optional)     PyTorch started from gridgpt's own init for seed S
Both print Megatron's log lines (" [date] iteration K/N | ... lm loss: X |", older logs without the
date, and " validation loss at iteration K | lm loss value: X |"), read here by one parser. Prints the table of validation losses
(markdown, for the doc) and the verdict; draws OUT.png (default docs/compare-torch.png): the
validation loss of every run and the mean of each side, the training loss, and, where the
same-init log is there, how far PyTorch's losses are from gridgpt's when both start from one point.
"""
import glob
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ITERATION = re.compile(r"^ (?:\[[^]]*\] )?iteration +(\d+)/ *\d+ \|.*\| lm loss: ([0-9.E+-]+) \|")
VALID = re.compile(r"^ validation loss at (?:iteration (\d+)|the end of training) \| lm loss value: ([0-9.E+-]+) \|")
TOTAL = re.compile(r"^ (?:\[[^]]*\] )?iteration +\d+/ *(\d+) \|")


def read_log(path):
    """{'train': {step: loss}, 'valid': {step: loss}}; the end-of-training evaluation at the last step."""
    train, valid, last = {}, {}, None
    with open(path) as f:
        for line in f:
            if m := ITERATION.match(line):
                train[int(m.group(1))] = float(m.group(2))
                last = int(TOTAL.match(line).group(1))
            elif m := VALID.match(line):
                valid[int(m.group(1)) if m.group(1) else last] = float(m.group(2))
    if not valid:
        sys.exit(f"error: {path}: no validation loss (did the run finish?)")
    return {"train": train, "valid": valid}


def runs(directory, side):
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, f"{side}_seed*.log"))):
        out[int(re.search(r"seed(\d+)\.log$", path).group(1))] = read_log(path)
    return out


def final(run):
    return run["valid"][max(run["valid"])]


def init_draws(directory, theirs, same_init):
    """Within PyTorch alone, its own init against gridgpt's for one seed (same batches): the seeds of
    DIR (torch_seedS, torch_gridgpt-init_seedS) and of DIR/init (torch-init_seedS, gridgpt-init_seedS,
    runs stopped early), at the last evaluation all of them share."""
    pairs = {s: (theirs[s], same_init[s]) for s in sorted(set(theirs) & set(same_init))}
    sub = os.path.join(directory, "init")
    own, grid = runs(sub, "torch-init"), runs(sub, "gridgpt-init")
    pairs.update({s: (own[s], grid[s]) for s in sorted(set(own) & set(grid))})
    if len(pairs) < 2:
        return
    step = min(min(max(a["valid"]), max(b["valid"])) for a, b in pairs.values())
    gaps = []
    print(f"\nPyTorch alone, from gridgpt's init against its own, validation loss at iteration {step}:")
    print("| seed | PyTorch's init | gridgpt's init | difference |")
    print("| ---: | ---: | ---: | ---: |")
    for s, (a, b) in sorted(pairs.items()):
        x, y = a["valid"][step], b["valid"][step]
        gaps.append(100 * (y - x) / x)
        print(f"| {s} | {x:.4f} | {y:.4f} | {gaps[-1]:+.2f}% |")
    sd = statistics.stdev(gaps)
    print(f"gridgpt's init higher in {sum(g > 0 for g in gaps)} of {len(gaps)} seeds; mean {statistics.mean(gaps):+.2f}%, "
          f"std {sd:.2f}%, standard error of the mean {sd / len(gaps) ** 0.5:.2f}%")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "docs/compare-torch.png"
    ours, theirs = runs(directory, "gridgpt"), runs(directory, "torch")
    same_init = runs(directory, "torch_gridgpt-init")
    seeds = sorted(set(ours) & set(theirs))
    if not seeds:
        sys.exit(f"error: no seed with both gridgpt_seedS.log and torch_seedS.log in {directory}")
    for s in seeds:
        if sorted(ours[s]["valid"]) != sorted(theirs[s]["valid"]):
            sys.exit(f"error: seed {s}: the two runs evaluated at different steps")

    # the table and the verdict
    g = [final(ours[s]) for s in seeds]
    t = [final(theirs[s]) for s in seeds]
    print("| seed | gridgpt | PyTorch | gridgpt − PyTorch |")
    print("| ---: | ---: | ---: | ---: |")
    for s, a, b in zip(seeds, g, t):
        print(f"| {s} | {a:.4f} | {b:.4f} | {a - b:+.4f} ({100 * (a - b) / b:+.2f}%) |")
    gm, tm = statistics.mean(g), statistics.mean(t)
    print(f"| mean | {gm:.4f} | {tm:.4f} | {gm - tm:+.4f} ({100 * (gm - tm) / tm:+.2f}%) |")
    if len(seeds) > 1:
        print(f"| seed spread (max − min; sample std) | {max(g) - min(g):.4f}; {statistics.stdev(g):.4f} "
              f"| {max(t) - min(t):.4f}; {statistics.stdev(t):.4f} | |")
    rel = abs(gm - tm) / tm
    print(f"\nverdict: gridgpt's mean final validation loss is {100 * rel:.2f}% from PyTorch's "
          f"({'within' if rel <= 0.02 else 'NOT within'} 2%) over {len(seeds)} seeds")
    for s, run in same_init.items():
        if s in ours:
            steps = sorted(set(run["valid"]) & set(ours[s]["valid"]))
            worst = max(abs(run["valid"][k] - ours[s]["valid"][k]) for k in steps)
            tsteps = sorted(set(run["train"]) & set(ours[s]["train"]))
            first = tsteps[0]
            print(f"same init (seed {s}): validation losses at most {worst:.2e} apart over {len(steps)} evaluations; "
                  f"training loss at step {first}: gridgpt {ours[s]['train'][first]:.6f}, "
                  f"PyTorch {run['train'][first]:.6f}; final: gridgpt {final(ours[s]):.6f}, PyTorch {final(run):.6f}")

    init_draws(directory, theirs, same_init)

    # the figure
    panels = 3 if same_init else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2))
    colors = {"gridgpt": "tab:blue", "PyTorch": "tab:orange"}
    for name, side in (("gridgpt", ours), ("PyTorch", theirs)):
        c = colors[name]
        for s in seeds:
            v = side[s]["valid"]
            axes[0].plot(sorted(v), [v[k] for k in sorted(v)], color=c, alpha=0.35, lw=1)
            tr = side[s]["train"]
            axes[1].plot(sorted(tr), [tr[k] for k in sorted(tr)], color=c, alpha=0.35, lw=1)
        steps = sorted(side[seeds[0]]["valid"])
        mean = [statistics.mean(side[s]["valid"][k] for s in seeds) for k in steps]
        axes[0].plot(steps, mean, color=c, lw=2.2, marker="o", ms=3,
                     label=f"{name}: mean of {len(seeds)} seeds (thin: each seed)")
        tsteps = sorted(side[seeds[0]]["train"])
        axes[1].plot(tsteps, [statistics.mean(side[s]["train"][k] for s in seeds) for k in tsteps], color=c, lw=2.2,
                     label=f"{name}: mean")
    axes[0].set_title("validation loss (the same valid samples)")
    axes[1].set_title("training loss (the same batches)")
    for ax in axes[:2]:
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    lo = min(min(final(r) for r in ours.values()), min(final(r) for r in theirs.values()))
    axes[0].set_ylim(lo - 0.3, lo + 3.0)
    axes[1].set_ylim(lo - 0.6, 8.0)
    if same_init:   # the gap, seed by seed: from each side's own init (solid), from one init (dashed)
        ax = axes[2]
        for i, s in enumerate(seeds):
            c = f"C{i + 2}"
            for other, style, what in ((theirs, "-", "own inits"), (same_init, "--", "one init")):
                if s not in other:
                    continue
                steps = sorted(set(other[s]["valid"]) & set(ours[s]["valid"]))
                ax.plot(steps, [100 * (ours[s]["valid"][k] - other[s]["valid"][k]) / other[s]["valid"][k] for k in steps],
                        style, color=c, marker="o", ms=3, label=f"seed {s}, {what}")
        ax.axhline(0, color="black", lw=0.8)
        for y in (-2, 2):
            ax.axhline(y, color="gray", lw=0.8, ls=":")
        ax.set_title("validation loss: (gridgpt − PyTorch) / PyTorch")
        ax.set_xlabel("iteration")
        ax.set_ylabel("%")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    with open(os.path.join(directory, f"gridgpt_seed{seeds[0]}.log")) as f:   # the model line names the shape
        shape = re.search(r"--num-layers (\d+) --hidden-size (\d+) --num-attention-heads (\d+)", f.read())
    fig.suptitle(f"gridgpt (./train_cpu) beside PyTorch (nanoGPT's GPT-2): {shape.group(1)} layers of {shape.group(2)}, "
                 f"{shape.group(3)} heads, on the same batches; {len(seeds)} seeds each", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"figure: {out}")


if __name__ == "__main__":
    main()
