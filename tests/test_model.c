/*
tests/test_model.c — the model and the training step, through the trainer's own functions.

  - whole-model gradient check: the backward pass against central finite differences of
    the forward loss, one random direction per tensor;
  - LR and batch-size schedules at chosen sample counts against Megatron's formulas;
  - an optimizer step with clipping against AdamW computed by hand;
  - a tiny model overfits one fixed batch;
  - two trainers with the same seed give bit-identical losses;
  - the config table: flags, defaults, ranges and choices parsed by walking it;
  - activation recomputation: the same loss and gradients bit for bit, an arena that a step
    fills exactly, the memory table showing that arena, the FLOPs of Megatron's 96 formula;
  - checkpoints saved and loaded through their narrow interface, with no trainer;
  - --check-cluster's report names nothing on even made-up figures, and a slow rank when there is one.
usage: test_model DATA_PREFIX   (a small dataset made by ./preprocess)
*/
#define TESTING
#include "../train.c"
#include "test.h"

static uint64_t rng_state = 42;
static float randn(void) {
    rng_state = splitmix64(rng_state);
    return normal_at(7, 11, rng_state);
}

static GPTConfig tiny_config(int embed_layernorm) {
    GPTConfig c = gpt_default_config();   // every field the trainer's default, then the model's own
    c.num_layers = 2;
    c.hidden_size = 16;
    c.num_attention_heads = 2;
    c.ffn_hidden_size = 40;
    c.seq_length = 7;
    c.max_position_embeddings = 9;
    c.vocab_size = 37;
    c.make_vocab_size_divisible_by = 16;
    c.padded_vocab_size = padded_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by, 1);
    c.embed_layernorm = embed_layernorm;
    c.init_method_std = 0.3f;   // large enough that every path carries gradient
    c.seed = 5;
    return c;
}

// Llama's choices on the tiny model: rotary positions (half of each head's 8 dims, an odd base),
// RMSNorm, SwiGLU, 4 query heads in 2 groups, an output layer of its own, no linear biases
static GPTConfig tiny_llama_config(void) {
    GPTConfig c = tiny_config(0);
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.position_embedding_type = POSITION_ROPE;
    c.rotary_percent = 0.5f;
    c.rotary_base = 777;
    c.normalization = NORM_RMSNORM;
    c.norm_epsilon = 1e-6f;
    c.swiglu = 1;
    c.group_query_attention = 1;
    c.num_query_groups = 2;
    c.untie_embeddings_and_output_weights = 1;
    c.disable_bias_linear = 1;
    return c;
}

static void random_batch(GPT* m, int vocab) {
    int N = m->B * m->T;
    for (int i = 0; i < N; i++) {
        rng_state = splitmix64(rng_state);
        m->slots[0].tokens[i] = (int)(rng_state % vocab);
        m->slots[0].targets[i] = (int)((rng_state >> 20) % vocab);
    }
}

// one micro-batch's loss and gradients, the loss kept on the device as the training schedule
// keeps it (loss_mean_add into m->loss_sum, read once)
static double loss_and_grads(GPT* m) {
    dev_zero(m->grads, m->num_params * sizeof(float));
    dev_zero(m->loss_sum, sizeof(double));
    gpt_forward_stage(m, 0, 1.0f / (m->B * m->T));
    loss_mean_add(m->loss_sum, m->losses, m->B * m->T);
    double loss = 0.0;
    dev_to_host(&loss, m->loss_sum, sizeof(double));
    gpt_backward(m, 0);
    return loss;
}

// Directional derivative of the loss along u (one tensor's slice, |u| = 1), by central
// differences: (L(p + h u) - L(p - h u)) / 2h, against the backward's g . u.
// The direction mixes the tensor's own gradient with noise, so a gradient that is wrong in
// size or in direction shows. Error budget: the loss is summed in double from fp32 token
// losses (relative round-off ~1e-7, so ~1e-6 absolute over a 2e-3 step -> ~5e-4 on the
// derivative), plus the h^2 truncation term; the derivative itself is ~1e-2 .. 1.
// With dropout: 0.3 of the hidden states and of the probabilities, the step's masks fixed (the
// same micro-batch of the same step, every forward), so the loss is a smooth function of the
// weights and the backward's masks, drawn again, must be the forward's.
// moe: a mixture of 4 experts, top 2, in every layer (1: Mixtral's router; 2: Qwen2-MoE's, the
// softmax before the top-k, a shared expert with its gate, and with Llama's block the QKV's bias
// alone, --add-qkv-bias, as Qwen2's attention), MoE losses off: the loss the
// forward returns is the LM loss alone (their gradients: tests/test_kernels.c's router checks);
// 3 and 4: 1 and 2 with an expert capacity of 0.5 (6 of the 42 choices an expert), policy probs
// and position, which drops choices (checked): their rows gone, their weights' gradients 0
static void gradient_check(int embed_layernorm, int alibi, int llama, int dropout, int moe) {
    GPTConfig c = llama ? tiny_llama_config() : tiny_config(embed_layernorm);
    if (alibi) c.position_embedding_type = POSITION_ALIBI;
    if (moe) {
        c.num_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 24;
        int qwen = moe == 2 || moe == 4;
        c.moe_router_pre_softmax = qwen;
        c.moe_shared_expert_intermediate_size = qwen ? 16 : 0;
        c.add_qkv_bias = qwen && c.disable_bias_linear;
        if (moe >= 3) c.moe_expert_capacity_factor = 0.5f, c.moe_token_drop_policy = moe == 3 ? MOE_DROP_PROBS : MOE_DROP_POSITION;
    }
    char variant[200];
    snprintf(variant, sizeof(variant), "%s%s%s%s", llama ? " (Llama: rope, RMSNorm, SwiGLU, GQA, untied, no biases)"
             : alibi ? " (BLOOM: embedding LayerNorm, ALiBi)" : embed_layernorm ? " (embedding LayerNorm)" : "",
             dropout ? " with dropout 0.3" : "", moe == 1 || moe == 3 ? " with 4 experts, top 2 (Mixtral's router)"
             : moe == 2 || moe == 4 ? " with 4 experts, top 2, softmax first, a shared expert (Qwen2-MoE's)" : "",
             moe == 3 ? ", capacity 0.5 (probs)" : moe == 4 ? ", capacity 0.5 (position)" : "");
    if (c.add_qkv_bias) snprintf(variant + strlen(variant), sizeof variant - strlen(variant), ", the QKV's bias alone");
    c.hidden_dropout = c.attention_dropout = dropout ? 0.3f : 0.0f;
    GPT m;
    gpt_build(&m, &c, 3, c.seq_length, 0, 1, 0, 1, 1, 1);
    DropoutStep step = {dropout, 3, 17, 0, 1};   // iteration 3, after 17 samples
    m.dropout = step;
    random_batch(&m, c.vocab_size);
    loss_and_grads(&m);
    if (moe >= 3)   // (the layers' training forward counts its drops)
        check(m.moe_dropped > 0, "model gradient check: the expert capacity drops choices", "none of %d layers x 42 "
              "choices dropped", c.num_layers);
    float* g = (float*)mallocCheck(m.num_params * sizeof(float));
    memcpy(g, m.grads, m.num_params * sizeof(float));
    const float h = 1e-3f;
    for (int i = 0; i < m.num_tensors; i++) {
        const TensorDesc* t = &m.tensors[i];
        float* p = m.params + t->offset;
        float* u = (float*)mallocCheck(t->numel * sizeof(float));
        double gnorm = 0.0, rnorm = 0.0, unorm = 0.0, analytic = 0.0;
        for (size_t k = 0; k < t->numel; k++) gnorm += (double)g[t->offset + k] * g[t->offset + k];
        for (size_t k = 0; k < t->numel; k++) {
            u[k] = randn();
            rnorm += (double)u[k] * u[k];
        }
        for (size_t k = 0; k < t->numel; k++) {
            u[k] = (float)(u[k] / sqrt(rnorm) + (gnorm > 0 ? g[t->offset + k] / sqrt(gnorm) : 0.0));
            unorm += (double)u[k] * u[k];
        }
        for (size_t k = 0; k < t->numel; k++) {
            u[k] = (float)(u[k] / sqrt(unorm));
            analytic += (double)g[t->offset + k] * u[k];
        }
        float* saved = (float*)mallocCheck(t->numel * sizeof(float));
        memcpy(saved, p, t->numel * sizeof(float));
        for (size_t k = 0; k < t->numel; k++) p[k] = saved[k] + h * u[k];
        double up = gpt_forward(&m, 0);
        for (size_t k = 0; k < t->numel; k++) p[k] = saved[k] - h * u[k];
        double down = gpt_forward(&m, 0);
        memcpy(p, saved, t->numel * sizeof(float));
        double numeric = (up - down) / (2.0 * h);
        double err = fabs(numeric - analytic);
        char name[512];
        snprintf(name, sizeof(name), "model gradient %s%s", t->name, variant);
        check(err <= 1e-3 + 1e-2 * fabs(analytic), name, "backward %.6e vs finite differences %.6e (error %.2e)",
              analytic, numeric, err);
        free(u);
        free(saved);
    }
    free(g);
    gpt_free(&m);
}

// ----------------------------------------------------------------------------
// dropout (kernels/random.cuh): the masks, and the model's use of them

// the fraction of 1s a dropout keeps of n, and whether each kept one is 1 / (1 - p) exactly
static double kept_fraction(const float* x, size_t n, float p, int* exact) {
    size_t kept = 0;
    *exact = 1;
    for (size_t i = 0; i < n; i++) {
        kept += x[i] != 0.0f;
        *exact &= x[i] == 0.0f || x[i] == 1.0f / (1.0f - p);
    }
    return (double)kept / n;
}

static void dropout_masks(void) {
    int T = 64, C = 512, rows = 4 * T;   // 4 samples of 64 tokens
    size_t n = (size_t)rows * C;
    float* ones = (float*)mallocCheck(n * sizeof(float));
    float *a = (float*)mallocCheck(n * sizeof(float)), *b = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
    char name[200];
    float ps[3] = {0.1f, 0.5f, 0.9f};
    for (int k = 0; k < 3; k++) {   // hidden: within 4 sigma of 1 - p, each kept value scaled exactly
        Dropout d = dropout_mask(ps[k], 1234, 7, 3, DROPOUT_MLP_OUTPUT, 100, 0);
        dropout_forward_cpu(a, ones, rows, C, T, 0, d);
        int exact;
        double kept = kept_fraction(a, n, ps[k], &exact), sigma = sqrt(ps[k] * (1.0 - ps[k]) / n);
        snprintf(name, sizeof(name), "hidden dropout %.1f keeps %.5f of %zu, within 4 sigma (%.5f) of %.1f, each times 1/(1-p)",
                 ps[k], kept, n, sigma, 1.0 - ps[k]);
        check(fabs(kept - (1.0 - ps[k])) <= 4.0 * sigma && exact, name, "kept %.5f, exact %d", kept, exact);
    }
    // attention: every (sample, head, query, key) of 4 samples x 8 heads x 64 x 64
    Dropout d = dropout_mask(0.1f, 1234, 7, 3, DROPOUT_ATTENTION_PROBS, 100, 8);
    size_t kept = 0, total = 0;
    for (int s = 0; s < 4; s++)
        for (int h = 0; h < 8; h++) {
            uint64_t key = dropout_head_key(&d, s, h);
            for (int t = 0; t < T; t++)
                for (int t2 = 0; t2 < T; t2++, total++) kept += dropout_factor(key, t, t2, &d) != 0.0f;
        }
    double sigma = sqrt(0.1 * 0.9 / total);
    snprintf(name, sizeof(name), "attention dropout 0.1 keeps %.5f of %zu, within 4 sigma (%.5f) of 0.9",
             (double)kept / total, total, sigma);
    check(fabs((double)kept / total - 0.9) <= 4.0 * sigma, name, "kept %zu", kept);
    // the mask of a row is its (sample, position, channel)'s: the rows in two pieces, as two
    // sequence-parallel ranks hold them (from global row rows / 2 on), draw the same mask
    d = dropout_mask(0.1f, 1234, 7, 3, DROPOUT_ATTENTION_OUTPUT, 100, 0);
    dropout_forward_cpu(a, ones, rows, C, T, 0, d);
    dropout_forward_cpu(b, ones, rows / 2, C, T, 0, d);
    dropout_forward_cpu(b + n / 2, ones, rows / 2, C, T, rows / 2, d);
    check(memcmp(a, b, n * sizeof(float)) == 0, "hidden dropout: the rows in two pieces (sequence parallelism) draw the "
          "whole's mask", "they differ");
    // and sample s of a micro-batch from sample 100 is sample s + 2 of one from 98 (data parallelism, micro-batches)
    Dropout later = dropout_mask(0.1f, 1234, 7, 3, DROPOUT_ATTENTION_OUTPUT, 98, 0);
    dropout_forward_cpu(b, ones, rows, C, T, 0, later);
    check(memcmp(a, b + 2 * (size_t)T * C, (n - 2 * (size_t)T * C) * sizeof(float)) == 0, "hidden dropout: a sample's mask "
          "is its global index's, whatever micro-batch it is in", "they differ");
    // another seed, iteration, layer, site or sample draws another mask (agreeing on about
    // p^2 + (1 - p)^2 = 0.82 of the elements)
    Dropout others[5] = {dropout_mask(0.1f, 1235, 7, 3, DROPOUT_ATTENTION_OUTPUT, 100, 0),
                         dropout_mask(0.1f, 1234, 8, 3, DROPOUT_ATTENTION_OUTPUT, 100, 0),
                         dropout_mask(0.1f, 1234, 7, 4, DROPOUT_ATTENTION_OUTPUT, 100, 0),
                         dropout_mask(0.1f, 1234, 7, 3, DROPOUT_MLP_OUTPUT, 100, 0),
                         dropout_mask(0.1f, 1234, 7, 3, DROPOUT_ATTENTION_OUTPUT, 101, 0)};
    const char* what[5] = {"seed", "iteration", "layer", "site", "sample"};
    for (int k = 0; k < 5; k++) {
        dropout_forward_cpu(b, ones, rows, C, T, 0, others[k]);
        size_t same = 0;
        for (size_t i = 0; i < n; i++) same += a[i] == b[i];
        snprintf(name, sizeof(name), "hidden dropout: another %s, another mask (%.3f of the elements agree)", what[k],
                 (double)same / n);
        check(fabs((double)same / n - 0.82) < 0.01, name, "%zu of %zu agree", same, n);
    }
    dropout_forward_cpu(b, ones, rows, C, T, 0, dropout_mask(0.0f, 1234, 7, 3, DROPOUT_ATTENTION_OUTPUT, 100, 0));
    check(memcmp(b, ones, n * sizeof(float)) == 0, "dropout 0 changes nothing", "it did");
    free(ones);
    free(a);
    free(b);
}

// the model's loss on one batch, its dropout step given
static double loss_with(GPTConfig c, DropoutStep step) {
    GPT m;
    gpt_build(&m, &c, 3, c.seq_length, 0, 1, 0, 1, 1, 1);
    m.dropout = step;
    rng_state = 5;
    random_batch(&m, c.vocab_size);
    double loss = gpt_forward(&m, 0);
    gpt_free(&m);
    return loss;
}

// training draws masks and changes the loss; evaluation (no step in training) is the model
// without dropout, bit for bit; another step or micro-batch draws other masks
static void dropout_in_the_model(void) {
    GPTConfig c = tiny_config(1), none = c;
    none.hidden_dropout = none.attention_dropout = 0.0f;
    DropoutStep training = {1, 4, 24, 0, 1}, evaluation = {0, 4, 24, 0, 1}, next = {1, 5, 32, 0, 1};
    double plain = loss_with(none, training), eval = loss_with(c, evaluation), train = loss_with(c, training);
    double again = loss_with(c, training), other = loss_with(c, next);
    GPTConfig hidden_only = c, attention_only = c;
    hidden_only.attention_dropout = 0.0f;
    attention_only.hidden_dropout = 0.0f;
    double h = loss_with(hidden_only, training), a = loss_with(attention_only, training);
    check(eval == plain, "evaluation with dropout 0.1 is the model without dropout, bit for bit", "%.9g vs %.9g", eval, plain);
    check(train != plain && train == again && other != train, "training with dropout 0.1: another loss than without, "
          "the same for the same step, another for the next step", "%.9g (without %.9g, again %.9g, next step %.9g)",
          train, plain, again, other);
    check(h != plain && a != plain && h != a, "hidden and attention dropout each change the training loss", "%.9g, %.9g, %.9g",
          h, a, plain);
}

// padded vocabulary rows stay zero and get no gradient; the loss ignores them
static void padding_is_inert(void) {
    GPTConfig c = tiny_config(0);
    GPT m;
    gpt_build(&m, &c, 2, c.seq_length, 0, 1, 0, 1, 1, 1);
    random_batch(&m, c.vocab_size);
    double before = loss_and_grads(&m);
    const TensorDesc* wte = &m.tensors[m.wte];
    float* rows = m.params + wte->offset + (size_t)c.vocab_size * c.hidden_size;
    float* grads = m.grads + wte->offset + (size_t)c.vocab_size * c.hidden_size;
    size_t n = (size_t)(c.padded_vocab_size - c.vocab_size) * c.hidden_size;
    double gsum = 0.0, psum = 0.0;
    for (size_t k = 0; k < n; k++) {
        gsum += fabs(grads[k]);
        psum += fabs(rows[k]);
        rows[k] = 100.0f;   // huge logits in the padding must change nothing
    }
    double after = gpt_forward(&m, 0);
    check(n > 0 && gsum == 0.0 && psum == 0.0, "padded vocabulary rows are zero and get no gradient",
          "%zu padded values, |param| sum %g, |grad| sum %g", n, psum, gsum);
    check(before == after, "padded vocabulary rows do not touch the loss", "loss %.9g became %.9g", before, after);
    gpt_free(&m);
}

// the same element of the same tensor gets the same initial value whatever the slice
static void init_is_layout_free(void) {
    GPTConfig c = tiny_config(0);
    c.padded_vocab_size = padded_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by, 2);
    GPT whole, half;
    gpt_build(&whole, &c, 1, c.seq_length, 0, 1, 0, 1, 1, 1);
    gpt_build(&half, &c, 1, c.seq_length, 1, 2, 0, 1, 1, 1);   // tensor rank 1 of 2 builds its slices
    int same = 1, compared = 0;
    for (int i = 0; i < half.num_tensors; i++) {
        const TensorDesc* h = &half.tensors[i];
        const TensorDesc* w = &whole.tensors[i];
        for (int r = 0; r < h->local_rows; r++)
            for (int col = 0; col < h->local_cols; col++) {
                float a = half.params[h->offset + (size_t)r * h->local_cols + col];
                float b = whole.params[w->offset + (size_t)(h->row_start + r) * w->cols + h->col_start + col];
                same &= a == b;
                compared++;
            }
    }
    check(same && compared > 0, "initialization is a function of (seed, tensor, element)",
          "a tensor-parallel slice differs from the same elements of the whole tensor");
    gpt_free(&whole);
    gpt_free(&half);
}

// ----------------------------------------------------------------------------
// schedules, with expected values worked out by hand from Megatron's formulas

static void lr_schedule(void) {
    LRSchedule s = {.max_lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 100, .decay_steps = 1000, .style = LR_LINEAR};
    struct { LRDecayStyle style; long long at; double want; } cases[] = {
        {LR_LINEAR, 0, 0.0},            // warm-up starts at 0
        {LR_LINEAR, 50, 5e-4},          // 1e-3 * 50 / 100
        {LR_LINEAR, 100, 1e-3},         // end of warm-up (<= warm-up: still the warm-up formula)
        {LR_LINEAR, 550, 5.5e-4},       // ratio 450/900 = 0.5: 1e-4 + 0.5 * 9e-4
        {LR_LINEAR, 1000, 1e-4},
        {LR_LINEAR, 5000, 1e-4},        // past the decay: min-lr
        {LR_COSINE, 550, 5.5e-4},       // 0.5 (cos(pi/2) + 1) = 0.5
        {LR_COSINE, 325, 8.6819805e-4}, // ratio 0.25: 1e-4 + 0.5 (cos(pi/4) + 1) * 9e-4
        {LR_CONSTANT, 50, 5e-4},        // constant still warms up
        {LR_CONSTANT, 5000, 1e-3},
        {LR_INVERSE_SQRT, 400, 5e-4},   // 1e-3 * sqrt(100) / sqrt(400)
    };
    const char* names[] = {"constant", "linear", "cosine", "inverse-square-root"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        s.style = cases[i].style;
        double got = learning_rate(&s, cases[i].at);
        char name[96];
        snprintf(name, sizeof(name), "learning rate %s at %lld samples", names[cases[i].style], cases[i].at);
        check(fabs(got - cases[i].want) <= 1e-6 * cases[i].want + 1e-12, name, "got %.9g, want %.9g", got, cases[i].want);
    }
}

static void iteration_based_lr_lengths(void) {
    Config a;
    set_defaults(&a);
    a.train_iters = 100;
    a.global_batch_size = 32;
    a.lr_warmup_iters = 10;
    LRSchedule s = make_lr_schedule(&a, 100);
    check(s.warmup_steps == 320 && s.decay_steps == 3200, "iteration flags become sample counts (x global batch)",
          "warm-up %lld, decay %lld samples; want 320 and 3200", s.warmup_steps, s.decay_steps);
    a.lr_warmup_iters = 0;
    a.lr_warmup_fraction = 0.1f;
    s = make_lr_schedule(&a, 100);
    check(s.warmup_steps == 320, "--lr-warmup-fraction of the decay length", "warm-up %lld, want 320", s.warmup_steps);
}

// the config table: defaults, every kind of flag, ranges, choices; and each model field
// written as text and read back (as checkpoint metadata does) gives the same value
static void config_table(void) {
    Config a;
    set_defaults(&a);
    check(a.model.num_layers == 4 && a.model.init_method_std == 0.02f && a.lr_decay_style == LR_LINEAR &&
          !strcmp(a.split, "969,30,1") && a.global_batch_size == 0, "defaults come from the table", "num_layers %d",
          a.model.num_layers);
    const char* argv[] = {"train", "--num-layers", "3", "--lr", "2e-3", "--lr-decay-style", "cosine", "--embed-layernorm",
                          "--train-samples", "5000000000", "--rampup-batch-size", "4", "8", "96", "--data-path", "0.3",
                          "A", "0.7", "B", "--split", "9,1,0"};
    char parse_err[512];
    parse_flags(&a, (int)(sizeof(argv) / sizeof(argv[0])), (char**)argv, parse_err, sizeof(parse_err));
    check(!parse_err[0] && a.model.num_layers == 3 && a.lr == 2e-3f && a.lr_decay_style == LR_COSINE && a.model.embed_layernorm &&
          a.train_samples == 5000000000LL && a.rampup_batch_size.v[2] == 96 && a.data_path.count == 4 &&
          !strcmp(a.data_path.v[3], "B") && !strcmp(a.split, "9,1,0"), "every kind of flag is parsed by walking the table",
          "num_layers %d, style %d, samples %lld, list %d", a.model.num_layers, a.lr_decay_style, a.train_samples,
          a.data_path.count);
    const char* bad[] = {"train", "--num-layers", "2", "--lr", "--seed", "3"};
    parse_flags(&a, 6, (char**)bad, parse_err, sizeof(parse_err));
    check(strstr(parse_err, "--lr expects a value, got the flag '--seed'") != NULL,
          "a bad flag comes back as its error line (the caller settles it with every rank)", "'%s'", parse_err);
    char err[256];
    const ConfigField* layers = &MODEL_FIELDS[0];
    check(parse_field(layers, &a.model, "4294967328", err, sizeof(err)) && strstr(err, "--num-layers") &&
          parse_field(layers, &a.model, "0", err, sizeof(err)) && strstr(err, "at least 1"),
          "an integer beyond int or below its field's minimum is refused, naming the flag", "%s", err);
    int same = 1;
    GPTConfig back;
    memset(&back, 0, sizeof(back));
    a.model.init_method_std = 0.0123456789f;
    for (int k = 0; k < NUM_MODEL_FIELDS; k++) {
        char text[64];
        same &= parse_field(&MODEL_FIELDS[k], &back, format_field(&MODEL_FIELDS[k], &a.model, text, sizeof(text)), err,
                            sizeof(err)) == 0;
    }
    same &= memcmp(&back, &a.model, offsetof(GPTConfig, padded_vocab_size)) == 0;
    check(same, "every model field survives being written as text and read back", "%s", err);
}

static void batch_rampup(void) {
    // start 4, increment 4, over 96 samples, to 16: three increments, one every 32 samples
    BatchSchedule b = {4, 16, 4, 4, 96};
    long long at[] = {0, 31, 32, 63, 64, 95, 96, 97, 100000};
    int want[] = {4, 4, 8, 8, 12, 12, 16, 16, 16};
    int ok = 1;
    for (int i = 0; i < 9; i++) ok &= current_global_batch_size(&b, at[i]) == want[i];
    check(ok, "batch-size ramp-up by consumed samples", "a ramp value differs from Megatron's formula");
    // 8 steps of 4 (to 32), 4 of 8 (to 64), 3 of 12 (to 100 > 96), then (1000 - 100) // 16 = 56
    int iters = train_iters_for_samples(&b, 1000);
    check(iters == 71, "train iterations for --train-samples with ramp-up", "got %d, want 71", iters);
    BatchSchedule flat = {4, 16, 0, 0, 0};
    check(train_iters_for_samples(&flat, 1000) == 62, "train iterations for --train-samples", "want 1000 // 16 = 62");
}

// ----------------------------------------------------------------------------
// optimizer step with clipping, against AdamW by hand (one parameter of each decay group)

static void optimizer_with_clipping(void) {
    GPTConfig c = tiny_config(0);
    GPT m;
    gpt_build(&m, &c, 1, c.seq_length, 0, 1, 0, 1, 1, 1);
    AdamWState s;
    adamw_init(&s, &m, 0);
    for (size_t k = 0; k < m.num_params; k++) m.grads[k] = 0.0f;
    const TensorDesc* w = &m.tensors[m.layer_tensors[0].qkv_w];   // decays
    const TensorDesc* b = &m.tensors[m.layer_tensors[0].qkv_b];   // does not
    m.grads[w->offset] = 3.0f;
    m.grads[b->offset] = 4.0f;   // global norm 5
    float pw = m.params[w->offset], pb = m.params[b->offset];
    AdamWConfig cfg = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    int skipped = 0;
    float norm = optimizer_step(&m, &s, &cfg, 0.01f, &skipped);
    // clip to 1: scale 1 / (5 + 1e-6); the first Adam step moves by lr * g / (|g| + eps') = lr
    double scale = 1.0 / (5.0 + 1e-6);
    double gw = 3.0 * scale, gb = 4.0 * scale;
    double mw = 0.1 * gw, vw = 0.05 * gw * gw;
    double want_w = pw - 0.01 * ((mw / 0.1) / (sqrt(vw / 0.05) + 1e-8) + 0.1 * pw);
    double mb = 0.1 * gb, vb = 0.05 * gb * gb;
    double want_b = pb - 0.01 * ((mb / 0.1) / (sqrt(vb / 0.05) + 1e-8));
    check(fabs(norm - 5.0) < 1e-6, "global gradient norm", "got %.9g, want 5", norm);
    check(fabs(m.params[w->offset] - want_w) < 1e-6 && fabs(m.params[b->offset] - want_b) < 1e-6,
          "AdamW step with clipping and decay groups", "weight %.9g (want %.9g), bias %.9g (want %.9g)",
          m.params[w->offset], want_w, m.params[b->offset], want_b);
    check(fabs(s.regions[0].m[w->offset] - mw) < 1e-7 && fabs(s.regions[0].v[b->offset] - vb) < 1e-7, "Adam moments after one step",
          "m %.9g (want %.9g), v %.9g (want %.9g)", s.regions[0].m[w->offset], mw, s.regions[0].v[b->offset], vb);
    m.grads[w->offset] = NAN;
    optimizer_step(&m, &s, &cfg, 0.01f, &skipped);
    check(skipped && s.step == 1, "a step with a non-finite gradient norm is skipped", "skipped %d, step %d", skipped, s.step);
    adamw_free(&s);
    gpt_free(&m);
}

// ----------------------------------------------------------------------------
// training

static void overfit_one_batch(void) {
    GPTConfig c = tiny_config(0);
    c.init_method_std = 0.02f;
    GPT m;
    gpt_build(&m, &c, 4, c.seq_length, 0, 1, 0, 1, 1, 1);
    AdamWState s;
    adamw_init(&s, &m, 0);
    AdamWConfig cfg = {0.9f, 0.95f, 1e-8f, 0.0f, 1.0f};
    random_batch(&m, c.vocab_size);
    double first = 0.0, last = 0.0;
    for (int step = 0; step < 300; step++) {
        last = loss_and_grads(&m);
        if (step == 0) first = last;
        int skipped;
        optimizer_step(&m, &s, &cfg, 3e-3f, &skipped);
    }
    // log(37) = 3.61 at the start; 28 random (token -> target) pairs are learnable exactly
    check(first > 3.0 && last < 0.05, "a tiny model overfits one fixed batch", "loss %.4f -> %.4f", first, last);
    adamw_free(&s);
    gpt_free(&m);
}

static void same_seed_same_losses(const char* data_prefix) {
    const char* argv[] = {"train", "--data-path", data_prefix, "--num-layers", "2", "--hidden-size", "32",
                          "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "2",
                          "--global-batch-size", "8", "--train-iters", "6", "--lr", "1e-3", "--lr-warmup-iters", "2",
                          "--split", "90,10,0", "--eval-iters", "1", "--seed", "7"};
    int argc = (int)(sizeof(argv) / sizeof(argv[0]));
    float losses[2][6], norms[2][6];
    for (int run = 0; run < 2; run++) {
        Trainer* t = (Trainer*)callocCheck(1, sizeof(Trainer));
        trainer_setup(t, argc, (char**)argv);
        for (int i = 0; i < 6; i++) {
            StepResult r = train_step(t);
            losses[run][i] = r.loss;
            norms[run][i] = r.grad_norm;
        }
        trainer_free(t);
        free(t);
    }
    check(memcmp(losses[0], losses[1], sizeof(losses[0])) == 0 && memcmp(norms[0], norms[1], sizeof(norms[0])) == 0,
          "two runs with the same seed give bit-identical losses and norms", "first losses %.9g vs %.9g",
          losses[0][0], losses[1][0]);
    check(losses[0][5] < losses[0][0], "the loss goes down over six steps", "%.4f -> %.4f", losses[0][0], losses[0][5]);
    // the whole run: training, evaluation and the summary, as main() runs it
    Trainer* t = (Trainer*)callocCheck(1, sizeof(Trainer));
    trainer_setup(t, argc, (char**)argv);
    trainer_run(t, NULL, NULL);
    check(t->progress.iteration == 6 && t->progress.consumed_samples == 48, "a whole run trains --train-iters steps",
          "iteration %d, consumed samples %lld", t->progress.iteration, t->progress.consumed_samples);
    trainer_free(t);
    free(t);
}

// ----------------------------------------------------------------------------
// activation recomputation

// The activation arena filled with 0xFF bytes (a NaN as float, -1 as int), which no step
// writes; afterwards, the bytes of the 256-byte blocks (the arena's alignment) a step wrote.
static void poison_arena(GPT* m) { memset(m->arena, 0xFF, m->arena_bytes); }
static size_t arena_bytes_written(const GPT* m) {
    const uint32_t* w = (const uint32_t*)m->arena;
    size_t written = 0;
    for (size_t b = 0; b < m->arena_bytes / 256; b++) {
        int any = 0;
        for (int k = 0; k < 64 && !any; k++) any = w[b * 64 + k] != 0xFFFFFFFFu;
        written += any ? 256 : 0;
    }
    return written;
}

// Every form of recomputation on one micro-batch gives the loss and the gradients of the model
// without, bit for bit, from an arena that the step fills exactly (no buffer left unused). It
// is smaller, but for one chunk of all the layers: with one micro-batch in flight its scratch
// is what the slot no longer holds (it saves only where PP micro-batches share the scratch).
static void recompute_same_bits(int llama) {
    struct { int method, n, smaller; const char* name; } cases[] = {
        {RECOMPUTE_NONE, 1, 0, "no recomputation"},
        {RECOMPUTE_UNIFORM, 1, 1, "uniform, chunks of 1 layer"},
        {RECOMPUTE_UNIFORM, 2, 1, "uniform, chunks of 2 layers (the last of the 3 alone)"},
        {RECOMPUTE_UNIFORM, 3, 0, "uniform, one chunk of 3 layers"},
        {RECOMPUTE_BLOCK, 2, 1, "block, the first 2 of 3 layers"},
    };
    double loss0 = 0.0;
    float* grads0 = NULL;
    size_t arena0 = 0;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        GPTConfig c = llama ? tiny_llama_config() : tiny_config(1);
        c.num_layers = 3;
        c.ffn_hidden_size = 4 * c.hidden_size;
        c.recompute_method = cases[k].method;
        c.recompute_num_layers = cases[k].n;
        GPT m;
        gpt_build(&m, &c, 3, c.seq_length, 0, 1, 0, 1, 1, 1);
        DropoutStep step = {1, 2, 6, 0, 1};   // dropout 0.1 on: the recomputed forward draws the forward's masks
        m.dropout = step;
        poison_arena(&m);
        rng_state = 99;
        random_batch(&m, c.vocab_size);
        double loss = loss_and_grads(&m);
        size_t written = arena_bytes_written(&m);
        char name[256];
        if (k == 0) {
            loss0 = loss;
            grads0 = (float*)mallocCheck(m.num_params * sizeof(float));
            memcpy(grads0, m.grads, m.num_params * sizeof(float));
            arena0 = m.arena_bytes;
        } else {
            snprintf(name, sizeof(name), "recomputation (%s%s, dropout 0.1): the same loss and gradients, bit for bit", cases[k].name,
                     llama ? ", Llama" : "");
            check(loss == loss0 && memcmp(grads0, m.grads, m.num_params * sizeof(float)) == 0, name,
                  "loss %.9g vs %.9g, or a gradient differs", loss, loss0);
            snprintf(name, sizeof(name), "recomputation (%s%s): %s arena (%zu bytes, %zu without)", cases[k].name,
                     llama ? ", Llama" : "", cases[k].smaller ? "a smaller" : "the same", m.arena_bytes, arena0);
            check(cases[k].smaller ? m.arena_bytes < arena0 : m.arena_bytes == arena0, name, "wrong size");
        }
        snprintf(name, sizeof(name), "%s%s: a step writes every 256-byte block of the arena (%zu bytes)", cases[k].name,
                 llama ? " (Llama)" : "", m.arena_bytes);
        check(written == m.arena_bytes && isfinite(loss), name, "%zu bytes written of %zu (loss %g)", written,
              m.arena_bytes, loss);
        gpt_free(&m);
    }
    free(grads0);
}

// rank 0's row of the start-up memory table in `path`: the activations' and workspaces' MiB (-1: no row)
static double table_activations_mib(const char* path) {
    FILE* f = fopen(path, "r");
    char line[1024];
    const char* p;
    double x[5], mib = -1.0;
    int rank;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, " rank %d", &rank) == 1 && rank == 0 && (p = strstr(line, "parameters:")) &&
            sscanf(p, "parameters: %lf | %lf | %lf | %lf | %lf", &x[0], &x[1], &x[2], &x[3], &x[4]) == 5)
            mib = x[3] + x[4];   // activations and workspaces: the arena, and the norm's 8 bytes
    if (f) fclose(f);
    return mib;
}

// The trainer's start-up memory table shows the arena a training step really fills, with and
// without --checkpoint-activations, as its activations and workspaces (the table prints MiB with
// one decimal, so the two columns' sum is within 0.1; the shape is large enough that the two
// runs differ by many of them)
static void memory_table_is_the_arena(const char* data_prefix) {
    const char* argv[] = {"train", "--data-path", data_prefix, "--num-layers", "4", "--hidden-size", "64",
                          "--num-attention-heads", "4", "--seq-length", "128", "--micro-batch-size", "4",
                          "--train-iters", "1", "--eval-iters", "0", "--split", "90,10,0", "--checkpoint-activations"};
    int argc = (int)(sizeof(argv) / sizeof(argv[0]));
    double mib = 1024.0 * 1024.0, table[2], arena[2];
    for (int with = 0; with < 2; with++) {
        char path[] = "/tmp/gridgpt_memory_table_XXXXXX";
        int fd = mkstemp(path), saved = dup(1);
        fflush(stdout);
        dup2(fd, 1);   // the start-up lines go to the file
        Trainer* t = (Trainer*)callocCheck(1, sizeof(Trainer));
        trainer_setup(t, with ? argc : argc - 1, (char**)argv);
        fflush(stdout);
        dup2(saved, 1);
        close(fd);
        close(saved);
        table[with] = table_activations_mib(path);
        unlink(path);
        poison_arena(&t->model);
        train_step(t);
        arena[with] = arena_bytes_written(&t->model) / mib;
        char name[192];
        snprintf(name, sizeof(name), "the memory table's activations + workspaces are the arena a step fills%s: %.1f MiB",
                 with ? " with --checkpoint-activations" : "", arena[with]);
        check(fabs(table[with] - arena[with]) <= 0.1 && arena[with] == t->model.arena_bytes / mib, name,
              "table %.1f MiB, the step wrote %.3f MiB of an arena of %.3f MiB", table[with], arena[with],
              t->model.arena_bytes / mib);
        trainer_free(t);
        free(t);
    }
    check(arena[1] < 0.5 * arena[0], "--checkpoint-activations keeps less than half the activations of this shape",
          "%.1f MiB vs %.1f MiB", arena[1], arena[0]);
}

// ----------------------------------------------------------------------------
// the pipeline schedule, walked without a model for every stage of a pipeline (pipeline.h's own
// functions, as the trainer and schedule_slots run them)

#define MAX_EVENTS 8192
typedef struct {
    TraceEvent event;
    Work w;
    int exchange;   // the exchange it belongs to (messages), or the exchanges before it (work)
} Event;
typedef struct {
    Event e[MAX_EVENTS];
    int n, exchanges, overflow;
} StageWalk;

static void record_event(void* ctx, TraceEvent event, Work w) {
    StageWalk* t = (StageWalk*)ctx;
    if (event == TRACE_EXCHANGE) t->exchanges++;
    Event x = {event, w, t->exchanges - 1};
    if (t->n < MAX_EVENTS) t->e[t->n++] = x;
    else t->overflow = 1;
}

static void walk_stage(StageWalk* t, int stage, int stages, int chunks, int group, int M, int forward_only) {
    memset(t, 0, sizeof(*t));
    Schedule s = schedule_walk(SCHEDULE_1F1B, stage, stages, chunks, group, -1, record_event, t);
    if (forward_only) run_forward_only(&s, M);
    else run_schedule(&s, M);
}

// A message as its receiver sees it: from which stage, activation or gradient, for which work
typedef struct {
    int from, gradient, micro, chunk, exchange;
} Message;

// each stage's messages, sent (to each peer) and received (from each peer), in posting order
typedef struct {
    Message* sent[8][8];   // [from][to]
    Message* got[8][8];    // [to][from]
    int num_sent[8][8], num_got[8][8];
} Messages;

static void add_message(Message** list, int* n, Message m) {
    *list = (Message*)reallocCheck(*list, (*n + 1) * sizeof(Message));
    (*list)[(*n)++] = m;
}

// The stages' messages from their walks. A sent activation of chunk c from the last stage
// feeds chunk c + 1 of the first; a gradient of chunk c from the first stage, chunk c - 1 of the last.
static void collect_messages(const StageWalk* walks, int P, Messages* out) {
    memset(out, 0, sizeof(*out));
    for (int p = 0; p < P; p++)
        for (int i = 0; i < walks[p].n; i++) {
            const Event* e = &walks[p].e[i];
            int next = (p + 1) % P, prev = (p + P - 1) % P;
            Message m = {p, 0, e->w.micro, e->w.chunk, e->exchange};
            if (e->event == TRACE_TO_NEXT) {
                m.chunk += p == P - 1;
                add_message(&out->sent[p][next], &out->num_sent[p][next], m);
            } else if (e->event == TRACE_TO_PREV) {
                m.gradient = 1;
                m.chunk -= p == 0;
                add_message(&out->sent[p][prev], &out->num_sent[p][prev], m);
            } else if (e->event == TRACE_FROM_PREV) {
                m.from = prev;
                add_message(&out->got[p][prev], &out->num_got[p][prev], m);
            } else if (e->event == TRACE_FROM_NEXT) {
                m.from = next;
                m.gradient = 1;
                add_message(&out->got[p][next], &out->num_got[p][next], m);
            }
        }
}

static void free_messages(Messages* ms) {
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 8; b++) {
            free(ms->sent[a][b]);
            free(ms->got[a][b]);
        }
}

// Do the exchanges run to the end, each waiting for its peers to post what it sends to and
// receives from them (a send completes only once its receive is posted, as NCCL's and MPI's
// large messages)? Each stage's k-th message to a peer is the peer's k-th from it.
static int runs_to_the_end(const StageWalk* walks, const Messages* ms, int P) {
    int at[8] = {0}, progress = 1;
    while (progress) {
        progress = 0;
        for (int p = 0; p < P; p++) {
            if (at[p] >= walks[p].exchanges) continue;
            int ready = 1;
            for (int q = 0; q < P && ready; q++) {
                for (int k = 0; k < ms->num_sent[p][q] && ready; k++)   // my k-th send to q: q's k-th receive from me
                    if (ms->sent[p][q][k].exchange == at[p] && ms->got[q][p][k].exchange > at[q]) ready = 0;
                for (int k = 0; k < ms->num_got[p][q] && ready; k++)
                    if (ms->got[p][q][k].exchange == at[p] && ms->sent[q][p][k].exchange > at[q]) ready = 0;
            }
            if (ready) {
                at[p]++;
                progress = 1;
            }
        }
    }
    for (int p = 0; p < P; p++)
        if (at[p] < walks[p].exchanges) return 0;
    return 1;
}

// For every stage of P with v chunks and M micro-batches (interleaved: G at a time, 0: P), training and forward-only: each
// (micro-batch, chunk) runs forward once and backward once after it (the head's forwards and
// backwards each in micro-batch order, the backward right after its forward, but for a last group
// of fewer than G: then no more micro-batches between the two than the logits schedule_head_logits
// plans, 2 in these cases, 1 in all others), every message one stage sends is the
// one its peer receives (the same micro-batch, the next virtual stage, in the same order: NCCL
// and MPI match a pair's messages in posting order, the two kinds one queue where both
// neighbours are one rank at PP 2), and the exchanges run to the end without a deadlock.
static void schedule_walks_pair_up(void) {
    // the last rows: --microbatch-group-size-per-virtual-pipeline-stage G, M not a multiple of P; the last three a
    // last group of P or more but fewer than G (Megatron-LM's docstring's P 2, v 2, M 5, G 3 and two more)
    int cases[][4] = {{2, 1, 1, 0}, {2, 1, 5, 0}, {4, 1, 3, 0}, {4, 1, 8, 0}, {2, 2, 2, 0}, {2, 2, 4, 0}, {2, 3, 2, 0},
                      {2, 3, 8, 0}, {3, 2, 3, 0}, {3, 2, 9, 0}, {4, 2, 4, 0}, {4, 2, 8, 0}, {4, 3, 12, 0}, {4, 4, 16, 0},
                      {8, 2, 8, 0}, {8, 3, 16, 0},
                      {2, 2, 3, 3}, {2, 2, 6, 3}, {2, 3, 8, 4}, {3, 2, 8, 4}, {4, 2, 9, 9}, {4, 2, 10, 5}, {4, 3, 12, 6},
                      {4, 2, 8, 8}, {8, 2, 22, 11}, {2, 2, 5, 3}, {4, 2, 9, 5}, {3, 2, 11, 4}};
    int bad_work = 0, bad_pairs = 0, deadlocks = 0, walks_done = 0, bad_logits = 0;
    char first_bad[256] = "";
    StageWalk* walks = (StageWalk*)mallocCheck(8 * sizeof(StageWalk));
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int P = cases[k][0], v = cases[k][1], M = cases[k][2], G = cases[k][3];
        int logits = schedule_head_logits(SCHEDULE_1F1B, P, v, G, M), short_group = v > 1 && M % (G ? G : P) != 0;
        bad_logits += logits != (short_group ? 2 : 1);
        for (int forward_only = 0; forward_only <= 1; forward_only++) {
            for (int p = 0; p < P; p++) walk_stage(&walks[p], p, P, v, G, M, forward_only);
            for (int p = 0; p < P; p++) {   // every work once, its backward after its forward
                int* done = (int*)callocCheck(M * v, sizeof(int));   // 1 forward, 2 backward
                int wrong = walks[p].overflow, head_forwards = 0, head_backwards = 0;
                for (int i = 0; i < walks[p].n; i++) {
                    const Event* e = &walks[p].e[i];
                    if (e->event != TRACE_FORWARD && e->event != TRACE_BACKWARD) continue;
                    int* d = &done[e->w.micro * v + e->w.chunk], want = e->event == TRACE_FORWARD ? 0 : 1;
                    if (*d != want) wrong = 1;
                    *d = want + 1;
                    if (p != P - 1 || e->w.chunk != v - 1) continue;   // the head: in order, at most `logits` apart
                    int* next = e->event == TRACE_FORWARD ? &head_forwards : &head_backwards;
                    if (e->w.micro != (*next)++) wrong = 1;
                    if (!forward_only && head_forwards - head_backwards > logits) wrong = 1;
                }
                for (int j = 0; j < M * v; j++) wrong |= done[j] != (forward_only ? 1 : 2);
                free(done);
                if (wrong && !first_bad[0]) snprintf(first_bad, sizeof first_bad, "P %d v %d M %d G %d stage %d%s", P, v, M, G, p,
                                                     forward_only ? " (forwards only)" : "");
                bad_work += wrong;
            }
            Messages ms;
            collect_messages(walks, P, &ms);
            for (int a = 0; a < P; a++)
                for (int b = 0; b < P; b++) {
                    int same = ms.num_sent[a][b] == ms.num_got[b][a];
                    for (int i = 0; same && i < ms.num_sent[a][b]; i++) {
                        const Message *s = &ms.sent[a][b][i], *g = &ms.got[b][a][i];
                        same = s->gradient == g->gradient && s->micro == g->micro && s->chunk == g->chunk;
                    }
                    if (!same && !first_bad[0]) snprintf(first_bad, sizeof first_bad, "P %d v %d M %d G %d: stage %d to %d",
                                                         P, v, M, G, a, b);
                    bad_pairs += !same;
                }
            int ends = runs_to_the_end(walks, &ms, P);
            if (!ends && !first_bad[0]) snprintf(first_bad, sizeof first_bad, "P %d v %d M %d G %d deadlocks", P, v, M, G);
            deadlocks += !ends;
            free_messages(&ms);
            walks_done++;
        }
    }
    free(walks);
    check(bad_work == 0 && bad_pairs == 0 && deadlocks == 0 && bad_logits == 0,
          "the pipeline schedule, plain and interleaved (groups of G too, M not a multiple of PP, short last groups), PP 2 "
          "to 8, v 1 to 4, training and forwards only (56 walks of every stage): every work once, the head's logits as "
          "planned, each message sent is the one received, in order, and no exchange deadlocks",
          "%d stage(s) with wrong work, %d wrong logits counts, %d pair(s) of stages whose messages differ, %d deadlock(s) "
          "(first: %s)", bad_work, bad_logits, bad_pairs, deadlocks, first_bad);
    (void)walks_done;
}

// The slots each chunk needs: plain 1F1B min(P - p, M) on stage p (the arena held P before);
// interleaved at P 4, v 2, M 8 (Narayanan et al.'s Fig. 4, drawn in docs/parallelism.md): a
// micro-batch's slot is taken when its input arrives (Megatron-LM's receives: on stage p > 0 the
// next forward's, on stage 0 the last stage's output of P - 1 forwards back) and freed by its
// backward. Stages 0 and 1 forward all 8 micro-batches of chunk 0 before its first backward;
// stage 3 alternates the head's forward and backward (1 slot) and holds chunk 0's micro-batches
// 0-4 when B0 of chunk 0 runs after F4. Megatron-LM holds 11 on stage 0 at once (its warm-up
// + 1); a slot per chunk takes the sum of the chunks' peaks, 12.
static void schedule_slot_counts(void) {
    int plain_ok = 1;
    for (int P = 1; P <= 4; P++)
        for (int M = 1; M <= 6; M++)
            for (int p = 0; p < P; p++) {
                int slots[1] = {1};
                schedule_slots(SCHEDULE_1F1B, p, P, 1, 0, M, 0, slots);
                plain_ok &= slots[0] == (P - p < M ? P - p : M);
            }
    check(plain_ok, "plain 1F1B: stage p of P needs min(P - p, M) micro-batch slots, for P 1-4 and M 1-6",
          "a count differs");
    int want[4][2] = {{8, 4}, {8, 4}, {7, 3}, {5, 1}}, got[4][2], ok = 1;
    for (int p = 0; p < 4; p++) {
        got[p][0] = got[p][1] = 1;
        schedule_slots(SCHEDULE_1F1B, p, 4, 2, 0, 8, 0, got[p]);
        ok &= got[p][0] == want[p][0] && got[p][1] == want[p][1];
    }
    check(ok, "interleaved 1F1B at P 4, v 2, M 8: slots per chunk 8+4, 8+4, 7+3, 5+1 on stages 0-3",
          "got %d+%d, %d+%d, %d+%d, %d+%d", got[0][0], got[0][1], got[1][0], got[1][1], got[2][0], got[2][1], got[3][0],
          got[3][1]);
}

static void flops_formulas(void) {
    Config a;
    set_defaults(&a);
    a.model = tiny_config(0);
    a.model.num_layers = 12;
    a.model.hidden_size = 768;
    a.model.ffn_hidden_size = 4 * 768;
    a.model.seq_length = 1024;
    a.model.padded_vocab_size = 50304;
    a.pipeline_model_parallel_size = 2;
    double B = 8, s = 1024, l = 12, h = 768, V = 50304, base = B * s * l * h * h;
    double three = 72 * base * (1 + s / (6 * h) + V / (12 * l * h)), four = 96 * base * (1 + s / (6 * h) + V / (16 * l * h));
    double layer_forward = 24 * B * s * h * h * (1 + s / (6 * h));
    double got3 = flops_per_step(&a.model, 8, recomputed_layers(&a), 0);
    a.model.recompute_method = RECOMPUTE_UNIFORM;
    a.model.recompute_num_layers = 3;
    double got4 = flops_per_step(&a.model, 8, recomputed_layers(&a), 0);
    a.model.recompute_method = RECOMPUTE_BLOCK;   // stages of 6 and 6 layers: 3 + 3 recomputed
    double got_block = flops_per_step(&a.model, 8, recomputed_layers(&a), 0);
    a.decoder_last_pipeline_num_layers = 2;      // stages of 10 and 2 layers: 3 + 2 recomputed
    double got_uneven = flops_per_step(&a.model, 8, recomputed_layers(&a), 0);
    a.model.recompute_method = RECOMPUTE_NONE;   // selective: every layer's scores q k^T once more (B s^2 h multiply-adds)
    a.model.recompute_attention_core = 1;
    double scores = 2 * B * s * s * h, got_selective = flops_per_step(&a.model, 8, 0, recomputed_attention_cores(&a, 0));
    double got_selective_fused = flops_per_step(&a.model, 8, 0, recomputed_attention_cores(&a, 1));
    check(fabs(got_selective / (three + l * scores) - 1) < 1e-12 &&
          fabs(got_selective_fused / three - 1) < 1e-12,
          "model FLOPs with selective recomputation: the probabilities' scores, 2 B s^2 h, once more per layer (none where "
          "the fused attention keeps no probabilities)", "%.6g vs %.6g, fused %.6g vs %.6g", got_selective, three + l * scores,
          got_selective_fused, three);
    check(fabs(got3 / three - 1) < 1e-12 && fabs(got4 / four - 1) < 1e-12 &&
          fabs(got_block / (three + 6 * layer_forward) - 1) < 1e-12 && fabs(got_uneven / (three + 5 * layer_forward) - 1) < 1e-12,
          "model FLOPs: 72 form, 96 form with every layer recomputed, block counts its recomputed layers per stage",
          "%.6g vs %.6g, %.6g vs %.6g, block %.6g vs %.6g, uneven %.6g vs %.6g", got3, three, got4, four, got_block,
          three + 6 * layer_forward, got_uneven, three + 5 * layer_forward);
    // the log line's FLOPs, Megatron-LM HEAD's num_floating_point_operations written out for Llama
    // 3 8B: 12 B s l h^2 ((1 + g/n + s/h/2) + 3/2 F/h) + 6 B s h V; flops_per_step counts the
    // attention's scores and their product with V whole, 1.125x that
    a.model = tiny_config(0);
    a.model.num_layers = 32, a.model.hidden_size = 4096, a.model.ffn_hidden_size = 14336, a.model.seq_length = 8192;
    a.model.num_attention_heads = 32, a.model.group_query_attention = 1, a.model.num_query_groups = 8;
    a.model.swiglu = 1, a.model.padded_vocab_size = 128256;
    B = 1, s = 8192, l = 32, h = 4096, V = 128256;
    double F = 14336, head = 12 * B * s * l * h * h * ((1 + 8.0 / 32 + s / h / 2) + 1.5 * F / h) + 6 * B * s * h * V;
    double causal = causal_flops_per_step(&a.model, 1), full = flops_per_step(&a.model, 1, 0, 0);
    check(fabs(causal / head - 1) < 1e-12 && fabs(full / causal - 1.125) < 1e-3,
          "the log line's FLOPs are Megatron-LM HEAD's (causal attention halved) for Llama 3 8B; full attention's 1.125x",
          "%.6g vs HEAD's %.6g, full / causal %.4f", causal, head, full / causal);
}

// CRC-32's standard check value (zlib, IEEE 802.3): "123456789" -> cbf43926; also across the
// 8-byte steps of the sliced loop, and continued over two calls
static void crc32_check_value(void) {
    const char* s = "123456789";
    uint32_t whole = crc32_update(0, s, 9);
    char long_text[45];
    for (int i = 0; i < 45; i++) long_text[i] = (char)('a' + i % 26);
    uint32_t once = crc32_update(0, long_text, 45), twice = crc32_update(crc32_update(0, long_text, 19), long_text + 19, 26);
    uint32_t bytewise = 0;
    for (int i = 0; i < 45; i++) bytewise = crc32_update(bytewise, long_text + i, 1);
    check(whole == 0xCBF43926u && once == twice && once == bytewise, "CRC-32 check value and incremental use",
          "crc(\"123456789\") = %08x (want cbf43926), %08x / %08x / %08x", whole, once, twice, bytewise);
}

// checkpoint.h alone: a model and its optimizer state saved, then loaded into a fresh model
// with the counters, every value back bit for bit; no trainer involved
static void checkpoint_without_trainer(void) {
    GPTConfig c = tiny_config(1);
    GPT m, back;
    AdamWState s, s_back;
    gpt_build(&m, &c, 1, c.seq_length, 0, 1, 0, 1, 1, 1);
    adamw_init(&s, &m, 0);
    for (int i = 0; i < m.num_tensors; i++)   // the padding rows of the vocabulary stay zero
        for (size_t k = m.tensors[i].offset; k < m.tensors[i].offset + (size_t)m.tensors[i].valid_rows * m.tensors[i].cols; k++) {
            m.params[k] += randn();
            s.regions[0].m[k] = randn();
            s.regions[0].v[k] = fabsf(randn());
        }
    s.step = 17;
    Progress p = {.iteration = 17, .consumed_samples = 1700, .scheduler_samples = 1600, .consumed_valid_samples = 40};
    char dir[] = "/tmp/gridgpt_ckpt_XXXXXX", iter[4300], err[1024];
    if (!mkdtemp(dir)) fail("mkdtemp: %s", strerror(errno));
    checkpoint_save(dir, &m, &s, &p, 0);
    gpt_build(&back, &c, 1, c.seq_length, 0, 1, 0, 1, 1, 1);
    adamw_init(&s_back, &back, 0);
    CheckpointMeta meta;
    if (latest_checkpoint(dir, iter, sizeof(iter), NULL, 0)) fail("bad marker in %s", dir);
    int rc = checkpoint_meta_read(iter, &meta, err, sizeof(err));
    if (rc == 0) checkpoint_load(&meta, &back, &s_back, 1);
    check(rc == 0 && memcmp(m.params, back.params, m.num_params * sizeof(float)) == 0 &&
          memcmp(s.regions[0].m, s_back.regions[0].m, m.num_params * sizeof(float)) == 0 &&
          memcmp(s.regions[0].v, s_back.regions[0].v, m.num_params * sizeof(float)) == 0
          && s_back.step == 17 && meta.progress.consumed_samples == 1700 && meta.progress.consumed_valid_samples == 40 &&
          memcmp(&meta.cfg, &c, sizeof(c)) == 0, "a checkpoint saved and loaded with no trainer: weights, moments, "
          "counters and config back bit for bit", "rc %d %s", rc, err);
    checkpoint_meta_free(&meta);
    remove_tree(dir);
    adamw_free(&s);
    adamw_free(&s_back);
    gpt_free(&m);
    gpt_free(&back);
}

// Megatron's dynamic loss scaler, step by step against a table worked out by hand from its
// rules (hysteresis 2, window 3, floor 1, start 8): overflows use up the hysteresis, then halve
// the scale each time down to the floor; 3 clean steps in a row double it and restore the
// hysteresis. A static scaler never moves.
static void loss_scaler_rules(void) {
    const int overflow[15] = {1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1};
    const float want[15] = {8, 4, 2, 1, 1, 1, 1, 2, 2, 2, 4, 4, 4, 2, 1};
    // step 1: hysteresis 2 -> 1, no change; 2-4: halve each; 5: at the floor; 6-8: the third
    // clean step doubles; 9-11: again; 12: an overflow with hysteresis 2 -> 1 keeps the scale;
    // 13: clean (the run of clean steps restarts); 14: hysteresis 0, halve; 15: halve
    LossScaler dynamic = {8.0f, 1, 1.0f, 3, 2, 0, 2}, fixed = {1024.0f, 0, 1.0f, 3, 2, 0, 2};
    int step_wrong = 0;
    for (int i = 0; i < 15 && !step_wrong; i++) {
        loss_scaler_update(&dynamic, overflow[i]);
        loss_scaler_update(&fixed, overflow[i]);
        if (dynamic.scale != want[i] || fixed.scale != 1024.0f) step_wrong = i + 1;
    }
    check(!step_wrong, "the dynamic loss scaler follows Megatron's rules step by step (a static one never moves)",
          "step %d: scale %g, expected %g (static %g)", step_wrong, dynamic.scale, want[step_wrong ? step_wrong - 1 : 0],
          fixed.scale);
}

// --check-cluster's report on made-up records of a (TP, PP, DP) = (2,2,2) grid on two hosts,
// "a" (stage 0: ranks 0-3) and "b" (stage 1: ranks 4-7): every group takes 1 ms per operation
// and every matmul 10 ms, except that rank `slow` makes its groups and its matmul 4x slower.
// Even: nothing is named. Rank 5 slow: its TP group 4,5, DP group 5,7 and PP group 1,5 (3
// operations each) and its link 1>5 (10 lines), its matmul (1), and host b's slowest matmul,
// slowest TP group and slowest DP group (3: its PP groups and links are host a's too) = 14;
// the 4 groups named all have rank 5 in them.
static int made_up_check_report(int slow, CheckReport* c, CheckRecord* r) {
    const int TP = 2, DP = 2, PP = 2, W = 8;
    static ClusterCheck cc = {{1 << 20, 4 << 20}, 2, 256};
    memset(r, 0, W * sizeof(CheckRecord));
    for (int q = 0; q < W; q++) {   // Megatron's order: rank = tp + TP * (dp + DP * pp)
        int tp = q % TP, dp = q / TP % DP, pp = q / (TP * DP);
        CheckRecord* x = &r[q];
        snprintf(x->host, sizeof(x->host), "%s", pp == 0 ? "a" : "b");
        x->tp = tp, x->dp = dp, x->pp = pp;
        x->first[CHECK_TP] = TP * (dp + DP * pp);
        x->first[CHECK_DP] = tp + TP * DP * pp;
        x->first[CHECK_PP] = tp + TP * dp;
        x->first[CHECK_WORLD] = 0;
        x->next_stage = pp + 1 < PP ? q + TP * DP : -1;
        x->first[CHECK_LINK] = x->next_stage >= 0 ? q : -1;
        x->matmul_seconds = q == slow ? 4e-2 : 1e-2;
    }
    for (int q = 0; q < W; q++)
        for (int k = 0; k < CHECK_KINDS; k++) {
            int with_slow = slow >= 0 && (k == CHECK_LINK ? q == slow || r[q].next_stage == slow : r[slow].first[k] == r[q].first[k]);
            for (int op = 0; op < CHECK_OPS; op++)
                for (int s = 0; s < cc.num_sizes; s++) r[q].seconds[k][op][s] = with_slow ? 4e-3 : 1e-3;
        }
    check_report(c, r, W, &cc);
    return c->named;
}

static void check_cluster_report(void) {
    CheckRecord r[8];
    CheckReport c;
    int even = made_up_check_report(-1, &c, r);
    free(c.named_in);
    check(even == 0, "--check-cluster names nothing when every rank and group is alike", "%d figure(s) named", even);
    int named = made_up_check_report(5, &c, r), others = 0;
    for (int q = 0; q < 8; q++) others += q != 5 && c.named_in[q] == c.named_groups;
    check(named == 14 && c.named_groups == 4 && c.named_in[5] == 4 && others == 0,
          "--check-cluster names a slow rank's 4 groups, its matmul and its host's 3 figures (14), and only it is in every one",
          "%d figure(s) named, %d group(s), rank 5 in %d, %d other rank(s) in all", named, c.named_groups, c.named_in[5], others);
    free(c.named_in);
}

int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    crc32_check_value();
    grid_build(1, 1, 1, 1);
    gradient_check(0, 0, 0, 0, 0);
    gradient_check(1, 0, 0, 0, 0);
    gradient_check(1, 1, 0, 0, 0);
    gradient_check(0, 0, 1, 0, 0);
    gradient_check(1, 0, 0, 1, 0);
    gradient_check(0, 0, 1, 1, 0);
    gradient_check(0, 0, 0, 0, 1);   // GELU experts with biases
    gradient_check(0, 0, 1, 1, 2);   // SwiGLU experts, no biases, dropout
    gradient_check(0, 0, 0, 0, 3);   // an expert capacity that drops, policy probs
    gradient_check(0, 0, 1, 0, 4);   // and policy position, Qwen2-MoE's router
    dropout_masks();
    dropout_in_the_model();
    padding_is_inert();
    init_is_layout_free();
    lr_schedule();
    iteration_based_lr_lengths();
    config_table();
    batch_rampup();
    optimizer_with_clipping();
    loss_scaler_rules();
    check_cluster_report();
    overfit_one_batch();
    checkpoint_without_trainer();
    recompute_same_bits(0);
    recompute_same_bits(1);
    schedule_walks_pair_up();
    schedule_slot_counts();
    flops_formulas();
    if (argc > 1) {
        same_seed_same_losses(argv[1]);
        memory_table_is_the_arena(argv[1]);
    } else check(0, "same seed, same losses", "usage: test_model DATA_PREFIX");
    int status = tests_summary();
    grid_finish();
    return status;
}
