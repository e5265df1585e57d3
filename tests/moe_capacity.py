#!/usr/bin/env python3
"""tests/moe_capacity.py PROGRAM — gridgpt's expert capacity (--moe-expert-capacity-factor) against
Megatron-Core's rule, written here from that rule alone (topk_softmax_with_capacity, its
get_capacity), in torch:

  the router     pre_softmax 0: the top k logits, then the softmax over those k;
                 pre_softmax 1: the softmax over all experts, then its top k;
                 routing_probs [N, E]: each token's k weights at its experts, 0 elsewhere;
  the capacity   ceil(N k / E x F) (no minimum); above N nothing is dropped;
  the drops      each expert's column of N tokens ranked, "probs": by routing_probs, the largest
                 first; "position": chosen first, then by token; the first `capacity` of the
                 column kept, and a choice is kept if its token is (Megatron-Core: topk along the
                 tokens, then AND with the routing map). Equal keys: the lower token first (torch's
                 topk leaves ties unordered; gridgpt fixes them so, and so does this reference,
                 with a stable sort);
  the weights    the router's, not renormalized over the kept (routing_probs x the kept mask).

PROGRAM is tests/build/test_parallel: with --moe-routing it reads the cases on stdin and prints the
routing moe.h's dispatch made of each (each choice's expert, weight and row, -1 dropped; the
experts' row offsets), in one run. Each case prints one PASS or FAIL line; the exit status is 1 if any failed. Every case
that should drop checks that it did, and the case of ties checks that a tie straddles a capacity.
"""
import math
import subprocess
import sys

import torch

POLICIES = ["probs", "position"]   # --moe-token-drop-policy's choices, in its order


def megatron_routing(logits, k, pre_softmax, factor, policy):
    """The reference: each choice's expert and weight [N, k], and whether it is kept [N, k]."""
    N, E = logits.shape
    if pre_softmax:
        weights, experts = torch.topk(torch.softmax(logits, dim=-1), k, dim=1)
    else:
        top, experts = torch.topk(logits, k, dim=1)
        weights = torch.softmax(top, dim=-1)
    routing_probs = torch.zeros(N, E, dtype=torch.float64).scatter(1, experts, weights.double())
    routing_map = torch.zeros(N, E, dtype=torch.bool).scatter(1, experts, True)
    capacity = math.ceil((N * k / E) * factor)
    capacity_mask = torch.ones(N, E, dtype=torch.bool)
    straddles = False   # a tie of keys across an expert's capacity (the tie rule decides)
    if capacity <= N:
        capacity_mask[:] = False
        for e in range(E):
            key = routing_probs[:, e] if policy == "probs" else routing_map[:, e].double()
            ranked = torch.sort(-key, stable=True).indices   # the largest first, ties to the lower token
            capacity_mask[ranked[:capacity], e] = True
            if capacity < N and routing_map[ranked[capacity], e] and key[ranked[capacity]] == key[ranked[capacity - 1]]:
                straddles = True
    final_map = routing_map & capacity_mask
    kept = torch.gather(final_map, 1, experts)
    return experts, weights, kept, capacity, straddles


def case_text(logits, k, pre_softmax, factor, policy):
    N, E = logits.shape
    text = f"{N} {E} {k} {pre_softmax} {factor!r} {POLICIES.index(policy)}\n"
    return text + "\n".join(" ".join(f"{v:.9g}" for v in row) for row in logits.tolist()) + "\n"


def gridgpt_routings(program, cases):
    """Each case's routing by gridgpt: experts, weights, positions [N, k] and the row offsets."""
    text = "".join(case_text(c["logits"], c["k"], c["pre_softmax"], c["factor"], c["policy"]) for c in cases)
    lines = iter(subprocess.run([program, "--moe-routing"], input=text, capture_output=True, text=True,
                                check=True).stdout.splitlines())
    routings = []
    for c in cases:
        N, k = c["logits"].shape[0], c["k"]
        experts = torch.zeros(N, k, dtype=torch.long)
        weights = torch.zeros(N, k, dtype=torch.float64)
        position = torch.zeros(N, k, dtype=torch.long)
        for _ in range(N * k):
            f = next(lines).split()
            assert f[0] == "choice", f
            t, j = int(f[1]), int(f[2])
            experts[t, j], weights[t, j], position[t, j] = int(f[3]), float(f[4]), int(f[5])
        f = next(lines).split()
        assert f[0] == "offsets", f
        routings.append((experts, weights, position, [int(v) for v in f[1:]]))
    return routings


def check_case(name, logits, k, pre_softmax, factor, policy, drops, routing, ties=False):
    N, E = logits.shape
    want_experts, want_weights, kept, capacity, straddles = megatron_routing(logits, k, pre_softmax, factor, policy)
    experts, weights, position, offsets = routing
    dropped = int((~kept).sum())
    problems = []
    if not torch.equal(experts, want_experts):
        problems.append("the top-k experts differ")
    if (weights - want_weights.double()).abs().max() > 1e-6:
        problems.append(f"the weights differ by {(weights - want_weights.double()).abs().max():.2e}")
    if not torch.equal(position >= 0, kept):
        problems.append(f"kept choices differ at (token, slot) {(position >= 0).ne(kept).nonzero().tolist()[:6]}")
    kept_per_expert = [int(((experts == e) & kept).sum()) for e in range(E)]
    if [offsets[e + 1] - offsets[e] for e in range(E)] != kept_per_expert:
        problems.append(f"the experts' rows {offsets} are not the kept choices' counts {kept_per_expert}")
    rows = sorted(position[position >= 0].tolist())
    if rows != list(range(len(rows))):
        problems.append("the kept choices' rows are not 0 .. kept - 1")
    if max(kept_per_expert) > capacity:
        problems.append(f"an expert took {max(kept_per_expert)} rows, above its capacity {capacity}")
    if drops != (dropped > 0):   # the case is what it claims: it drops, or it cannot
        problems.append(f"{dropped} dropped where the case expects {'some' if drops else 'none'}")
    if ties and not straddles:
        problems.append("no tie straddles a capacity: the tie rule is not exercised")
    label = (f"moe capacity {name}: N={N} E={E} k={k} pre_softmax={pre_softmax} F={factor} {policy}, capacity "
             f"{capacity}, {dropped} of {N * k} choices dropped as Megatron-Core's rule drops them")
    print(f"FAIL {label}: {'; '.join(problems)}" if problems else f"PASS {label}")
    return not problems


def main():
    program = sys.argv[1]
    torch.manual_seed(50)

    def skewed(N, E):   # random logits, the experts' popularity uneven (so that capacities bind)
        return (torch.randn(N, E) + torch.linspace(1.5, -1.5, E)).float()

    cases = []
    for policy in POLICIES:
        def case(name, logits, k, pre_softmax, factor, drops, ties=False):
            cases.append(dict(name=name, logits=logits, k=k, pre_softmax=pre_softmax, factor=factor, policy=policy,
                              drops=drops, ties=ties))
        for pre_softmax in (0, 1):
            case("Mixtral-sized", skewed(32, 4), 2, pre_softmax, 1.0, drops=True)
        case("a fractional capacity", skewed(37, 8), 2, 1, 0.3, drops=True)
        case("Qwen2-MoE-sized", skewed(29, 60), 4, 1, 0.5, drops=True)
        case("a capacity above the tokens", skewed(16, 4), 2, 0, 2.5, drops=False)
        # ties: tokens repeat 3 distinct rows, so equal weights meet at an expert's capacity
        case("ties to the lower token", skewed(3, 4)[torch.arange(24) % 3], 2, 0, 0.5, drops=True, ties=True)
    ok = True
    for c, routing in zip(cases, gridgpt_routings(program, cases)):
        ok &= check_case(c["name"], c["logits"], c["k"], c["pre_softmax"], c["factor"], c["policy"], c["drops"], routing,
                         c["ties"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
