#!/usr/bin/env python3
"""scripts/trace_plot.py TRACE.json OUT.png|OUT.svg [--iteration N] [--width INCHES]

Draws one step of a trace written by --profile (docs/profiling.md) as a timeline picture: one
row per rank and track (the host's; on the GPU build also the compute stream and the
communication stream), time to the right in milliseconds from the step's first start on any
rank. Each span is a bar coloured by its kind; a span inside another (an all-reduce inside a
forward) is a thin strip along its parent's lower edge; forwards and backwards are labelled
F3 / B3 (micro-batch 3, counted from 1) where they are wide enough. Needs matplotlib
(Debian's python3-matplotlib); the text tools (scripts/trace_schedule.py) need nothing.
"""
import json
import sys

COLOURS = {   # by span name, then by category
    "forward": "#4c72b0", "backward": "#55a868", "load micro-batch": "#937860",
    "pipeline": "#c4c4c4", "collective": "#dd8452", "host communication": "#e0cf8a",
    "optimizer": "#8172b3", "data": "#937860", "evaluation": "#64b5cd", "checkpoint": "#da8bc3",
}
LEGEND = [("forward", "forward"), ("backward", "backward"), ("pipeline", "pipeline send / receive"),
          ("collective", "collective (TP, DP, embedding)"), ("host communication", "host values (loss, norm)"),
          ("optimizer", "optimizer (norm, AdamW)"), ("data", "data loading")]
TRACK_NAMES = {0: "host", 1: "compute", 2: "comm"}


def colour(e):
    return COLOURS.get(e["name"]) or COLOURS.get(e["cat"], "#bbbbbb")


def depths(spans):
    """each span's nesting depth on its track (spans sorted by start, longest first)"""
    out, ends = [], []
    for e in spans:
        while ends and ends[-1] <= e["ts"]:
            ends.pop()
        out.append(len(ends))
        ends.append(e["ts"] + e["dur"])
    return out


def main(argv):
    args = argv[1:]
    if len(args) < 2:
        sys.exit(__doc__.strip().splitlines()[0])
    path, out, only, width = args[0], args[1], None, 12.0
    i = 2
    while i < len(args):
        if args[i] == "--iteration": only, i = int(args[i + 1]), i + 2
        elif args[i] == "--width": width, i = float(args[i + 1]), i + 2
        else: sys.exit("unknown argument %s" % args[i])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(path) as f:
        doc = json.load(f)
    other = doc["otherData"]
    it = only if only is not None else other["iterations"][0]
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in spans if e["name"] == "step" and e["args"]["iteration"] == it]
    if not steps:
        sys.exit("%s: no step span for iteration %d" % (path, it))
    t0, t1 = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    ranks = {r["rank"]: r for r in other["ranks"]}
    tracks = sorted({(e["pid"], e["tid"]) for e in spans})
    rows = {t: k for k, t in enumerate(tracks)}
    fig, ax = plt.subplots(figsize=(width, 0.42 * len(tracks) + 1.6))
    for track in tracks:
        mine = sorted((e for e in spans if (e["pid"], e["tid"]) == track and e["name"] != "step" and
                       e["ts"] < t1 and e["ts"] + e["dur"] > t0), key=lambda e: (e["ts"], -e["dur"]))
        y = len(tracks) - 1 - rows[track]
        for e, depth in zip(mine, depths(mine)):
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            if depth == 0:
                ax.barh(y, w, left=x, height=0.8, color=colour(e), edgecolor="white", linewidth=0.3)
            else:   # inside its parent: a strip along the lower edge, one step up per level
                ax.barh(y - 0.4 + 0.2 * depth - 0.1, w, left=x, height=0.2, color=colour(e), linewidth=0)
            if e["name"] in ("forward", "backward") and w > (t1 - t0) / 1e3 / 90:
                ax.text(x + w / 2, y, "%s%d" % (e["name"][0].upper(), e["args"]["micro_batch"] + 1), ha="center",
                        va="center", fontsize=6, color="white", clip_on=True)
    labels = []
    for pid, tid in tracks:
        r = ranks.get(pid, {})
        labels.append("rank %d (%s,%s,%s) %s" % (pid, r.get("tp"), r.get("pp"), r.get("dp"), TRACK_NAMES.get(tid, tid)))
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels(reversed(labels), fontsize=7)
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("ms from the step's start (clocks aligned as the file's otherData says)", fontsize=8)
    layout = other["layout"]
    ax.set_title("gridgpt --profile, %s build: iteration %d at (TP, PP, DP) = (%d, %d, %d), rows: rank (tp,pp,dp) track"
                 % (other["build"].split(",")[0], it, layout["tp"], layout["pp"], layout["dp"]), fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    fig.legend(handles=[Patch(color=COLOURS[k], label=text) for k, text in LEGEND], fontsize=7, ncol=len(LEGEND),
               loc="lower center", frameon=False)
    fig.tight_layout(rect=(0, 0.3 / fig.get_figheight(), 1, 1))   # 0.3 inch below for the legend
    fig.savefig(out, dpi=110)
    print("%s: iteration %d, %d tracks, %.3f ms" % (out, it, len(tracks), (t1 - t0) / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
