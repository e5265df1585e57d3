/*
tests/hf_logits.c — our side of the Hugging Face export check (tests/test_hf.sh).

  hf_logits --make-checkpoint DIR [--seed S] [--num-layers L] [--hidden-size C]
            [--num-attention-heads H] [--ffn-hidden-size F] [--max-position-embeddings P]
            [--vocab-size V] [--make-vocab-size-divisible-by D] [--embed-layernorm]
            [--perturb A] [--iteration N]
      builds a one-process model with gpt_build, adds A x N(0, 1) to every parameter
      (LayerNorm gains and all biases included, so that none of them is a trivial 1 or 0),
      makes up Adam moments, and saves it with checkpoint.h's checkpoint_save (no trainer):
      DIR/iter_NNNNNNN/ and latest_checkpointed_iteration.txt; prints the iter dir.
  hf_logits --export CKPT_ITER_DIR OUT [gpt2|bloom|llama|mixtral|qwen2_moe]
      export_hf(), no tokenizer: OUT/config.json, model.safetensors and generation_config.json
      (the architecture: the model's, or the one named).
  hf_logits --logits CKPT_ITER_DIR TOKEN...
      loads the checkpoint's weight section by tensor name into a one-process model (every
      tensor's CRC verified), runs gpt_forward on the tokens (B = 1, T = their number) and
      prints the logits: one line per position, vocab_size numbers, %.9g.
  hf_logits --routing CKPT_ITER_DIR TOKEN...
      the same forward of a mixture of experts, then each MoE layer's routing (moe.h's
      MoERouting, as the aux loss reads it): one line per MoE layer, "LAYER c_0 .. c_E-1 P_0 ..
      P_E-1", c_e the rows routed to expert e (the k choices of every token), P_e the sum over
      the tokens of the router's softmax at e (%.9g).
Exit status 2 with one line on stderr for bad input.
*/
#define TESTING
// the trainer's own main path (trainer_setup, trainer_run, ...) is not called here
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "../train.c"
#pragma GCC diagnostic pop

// bad input: the trainer's own error path (one line on stderr, exit status 2)
static void input_error(const char* why) { config_error("%s", why); }

static void usage_error(const char* why) {
    config_error("%s; usage: hf_logits --make-checkpoint DIR [model flags] | --export CKPT_ITER_DIR OUT | "
                 "--logits CKPT_ITER_DIR TOKEN... | --routing CKPT_ITER_DIR TOKEN...", why);
}

// ----------------------------------------------------------------------------
// a checkpoint of a made-up model, saved through checkpoint.h's interface alone

// the model flags (gpt.h's list) and --iteration N, --perturb A
static GPTConfig make_config(int argc, char** argv, int* iteration, float* perturb) {
    GPTConfig c = gpt_default_config();   // every field the trainer's default, then the model's own
    c.num_layers = 2;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.ffn_hidden_size = 96;   // not 4 x hidden: the export must carry n_inner
    c.max_position_embeddings = 20;
    c.vocab_size = 257;
    c.make_vocab_size_divisible_by = 128;
    c.init_method_std = 0.02f;
    c.seed = 1234;
    char err[256], flag[96];
    for (int i = 3; i < argc; i++) {
        const char* f = argv[i];
        int k = 0;
        while (k < NUM_MODEL_FIELDS && strcmp(f, flag_of(&MODEL_FIELDS[k], flag, sizeof(flag))) != 0) k++;
        if (i + 1 >= argc && (k == NUM_MODEL_FIELDS || MODEL_FIELDS[k].kind != FIELD_SWITCH)) usage_error("a flag is missing its value");
        if (!strcmp(f, "--iteration")) *iteration = atoi(argv[++i]);
        else if (!strcmp(f, "--perturb")) *perturb = (float)atof(argv[++i]);
        else if (k == NUM_MODEL_FIELDS) usage_error(f);
        else if (MODEL_FIELDS[k].kind == FIELD_SWITCH) *(int*)field_in(&MODEL_FIELDS[k], &c) = 1;
        else if (parse_field(&MODEL_FIELDS[k], &c, argv[++i], err, sizeof(err))) usage_error(err);
    }
    c.seq_length = c.max_position_embeddings;
    c.padded_vocab_size = padded_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by, 1);   // 384: 127 padding rows
    return c;
}

static void make_checkpoint(int argc, char** argv) {
    int iteration = 100;
    float perturb = 0.3f;
    GPTConfig c = make_config(argc, argv, &iteration, &perturb);
    GPT m;
    gpt_build(&m, &c, 1, c.seq_length, 0, 1, 0, 1, 1, 1);
    AdamWState s;
    adamw_init(&s, &m, 0);   // on the CPU build the master weights are the parameters
    // perturb every parameter (rows below valid_rows: the padding stays zero), keyed like the
    // init; made-up moments, so that all three sections are real data
    for (int i = 0; i < m.num_tensors; i++) {
        const TensorDesc* t = &m.tensors[i];
        const ShardRegion* g = &s.regions[t->offset >= m.expert_params_start];   // (one process: the whole region)
        uint64_t key = hash_name(t->name);
        for (size_t e = 0; e < (size_t)t->valid_rows * t->cols; e++) {
            float r = normal_at(c.seed + 1, key, e);
            m.params[t->offset + e] += perturb * normal_at(c.seed, key ^ 0x5eed, e);
            g->m[t->offset - g->shard_start + e] = 1e-3f * r;
            g->v[t->offset - g->shard_start + e] = 1e-6f * r * r;
        }
    }
    s.step = iteration;
    Progress p = {.iteration = iteration, .consumed_samples = 32LL * iteration, .scheduler_samples = 32LL * iteration};
    checkpoint_save(argv[2], &m, &s, &p, 0);
    char iter[4300];
    iter_dir(iter, sizeof(iter), argv[2], iteration);
    printf("%s\n", iter);
    adamw_free(&s);
    gpt_free(&m);
}

// ----------------------------------------------------------------------------
// our logits for a token sequence, from a checkpoint's weights

// a one-process model of the checkpoint argv[2]'s weights, run forward on the tokens argv[3..]
static void forward_from_checkpoint(int argc, char** argv, GPT* m) {
    char err[1024];
    CheckpointMeta ck;
    if (checkpoint_meta_read(argv[2], &ck, err, sizeof(err)) != 0) input_error(err);
    const GPTConfig* c = &ck.cfg;
    int T = argc - 3;
    if (T < 1 || T > c->max_position_embeddings) usage_error("give 1 to max_position_embeddings tokens");
    gpt_build(m, c, 1, T, 0, 1, 0, 1, 1, 1);
    FILE* bin = fopen(ck.bin_path, "rb");
    if (!bin) input_error(strerror(errno));
    for (int i = 0; i < m->num_tensors; i++) {
        const TensorDesc* d = &m->tensors[i];
        int j = 0;
        while (j < ck.num_tensors && strcmp(ck.tensors[j].name, d->name) != 0) j++;
        if (j == ck.num_tensors) input_error(d->name);
        float* host = (float*)callocCheck(d->numel, sizeof(float));   // vocabulary padding rows stay zero
        if (ckpt_read_tensor(&ck, bin, j, host, err, sizeof(err)) != 0) input_error(err);
        floats_to_dev_floatX(m->params + d->offset, host, d->numel);
        free(host);
    }
    fclose(bin);
    for (int t = 0; t < T; t++) {
        int tok = atoi(argv[3 + t]);
        if (tok < 0 || tok >= c->vocab_size) usage_error("a token is outside the vocabulary");
        m->slots[0].tokens[t] = tok;
        m->slots[0].targets[t] = 0;
    }
    gpt_forward(m, 0);
    checkpoint_meta_free(&ck);
}

static void print_logits(int argc, char** argv) {
    GPT m;
    forward_from_checkpoint(argc, argv, &m);
    int T = m.T;
    float* logits = (float*)mallocCheck((size_t)T * m.vocab_local * sizeof(float));
    dev_floatX_to_floats(logits, m.logits, (size_t)T * m.vocab_local);
    for (int t = 0; t < T; t++) {
        for (int v = 0; v < m.cfg.vocab_size; v++) printf(v ? " %.9g" : "%.9g", logits[(size_t)t * m.vocab_local + v]);
        printf("\n");
    }
    free(logits);
    gpt_free(&m);
}

// each MoE layer's routing after the forward (the CPU build's: host memory)
static void print_routing(int argc, char** argv) {
    GPT m;
    forward_from_checkpoint(argc, argv, &m);
    for (int i = 0; i < m.num_local_layers; i++) {
        if (m.layer_tensors[i].router_w < 0) continue;
        const MoERouting* r = &m.slots[0].layers[i].route;
        printf("%d", global_layer(&m, i));
        for (int e = 0; e < r->E; e++) printf(" %d", r->counts[e]);
        for (int e = 0; e < r->E; e++) {
            double P = 0.0;
            for (int t = 0; t < r->N; t++) P += r->probs[(size_t)t * r->E + e];
            printf(" %.9g", P);
        }
        printf("\n");
    }
    gpt_free(&m);
}

int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    grid_build(1, 1, 1, 1);
    if (argc >= 3 && !strcmp(argv[1], "--make-checkpoint")) make_checkpoint(argc, argv);
    else if ((argc == 4 || argc == 5) && !strcmp(argv[1], "--export")) {
        char err[1024];
        HFArchitecture arch = argc == 4 ? HF_AUTO : HF_LLAMA;   // (a name not below: Llama)
        for (int a = HF_GPT2; argc == 5 && a < HF_NUM_ARCHITECTURES; a++)
            if (!strcmp(argv[4], hf_model_type((HFArchitecture)a))) arch = (HFArchitecture)a;
        if (export_hf(argv[2], argv[3], &arch, NULL, NULL, err, sizeof(err)) != 0) input_error(err);
        printf("exported %s to %s as %s\n", argv[2], argv[3], hf_class_name(arch));
    } else if (argc >= 4 && !strcmp(argv[1], "--logits")) print_logits(argc, argv);
    else if (argc >= 4 && !strcmp(argv[1], "--routing")) print_routing(argc, argv);
    else usage_error("no mode given");
    grid_finish();
    return 0;
}
