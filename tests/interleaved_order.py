#!/usr/bin/env python3
"""tests/interleaved_order.py P V M [G] [--from 1] — the order of Megatron-LM's interleaved 1F1B,
stated here from its definition, independently of pipeline.h, one line per pipeline stage:

  stage 0: F0a F1a ... B7a

F = a forward, B = a backward, the micro-batch (from 0, or from 1 with --from 1 as --print-schedule
counts them), the model chunk as a letter (a: the stage's first). G (default P) is
--microbatch-group-size-per-virtual-pipeline-stage, Megatron-LM's microbatch_group_size_per_vp_stage.

The rule (Megatron-LM's megatron/core/pipeline_parallel/schedules.py, as of the schedule table):
  - the table: the micro-batches cut into groups of G from 0, the last group from its start to M
    (G or fewer); each group contributes (micro-batch, chunk) for chunk 0, then 1, ..., each
    chunk with the group's micro-batches in order. A stage's k-th forward is entry k; its k-th
    backward is entry k with the chunk mirrored (V - 1 - chunk);
  - stage p of P warms up with W = min(V M, 2 (P - p - 1) + (V - 1) G) forwards, then alternates
    forward W + k, backward k while forwards are left, then runs the backwards left;
  - Megatron-LM refuses G outside [P, M], and a last group of 1 to P - 1 micro-batches
    (M mod G in 1 .. P - 1): this script refuses the same, exit status 2.
"""
import sys


def table(M, V, G):
    entries = []
    for start in range(0, M, G):
        end = M if start + G >= M else start + G
        entries += [(micro, chunk) for chunk in range(V) for micro in range(start, end)]
    return entries


def stage_order(p, P, V, M, G):
    t = table(M, V, G)
    total = V * M
    warmup = min(total, 2 * (P - p - 1) + (V - 1) * G)
    forward = lambda k: ('F',) + t[k]
    backward = lambda k: ('B', t[k][0], V - 1 - t[k][1])
    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def main(argv):
    first = 0
    if '--from' in argv:
        i = argv.index('--from')
        first = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    P, V, M = (int(x) for x in argv[:3])
    G = int(argv[3]) if len(argv) == 4 else P
    if not P <= G <= M or 0 < M % G < P:
        print(f"refused: G {G} for P {P}, M {M} (Megatron-LM: P <= G <= M, M mod G 0 or >= P)", file=sys.stderr)
        return 2
    for p in range(P):
        print(f"stage {p}: " + " ".join(f"{kind}{micro + first}{'abcdefghijklmnopqrstuvwxyz'[chunk]}"
                                        for kind, micro, chunk in stage_order(p, P, V, M, G)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
