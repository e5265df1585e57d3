/*
tests/hf_logits.c — our side of the Hugging Face export check (tests/test_hf.sh).

  hf_logits --make-checkpoint DIR [--seed S] [--num-layers L] [--hidden-size C]
            [--num-attention-heads H] [--ffn-hidden-size F] [--max-position-embeddings P]
            [--vocab-size V] [--make-vocab-size-divisible-by D] [--embed-layernorm]
            [--perturb A] [--iteration N]
      builds a one-process model with gpt_build, adds A x N(0, 1) to every parameter
      (LayerNorm gains and all biases included, so that none of them is a trivial 1 or 0),
      and writes it as a checkpoint DIR/iter_NNNNNNN/ (metadata.txt + tensors.bin, the
      format train.c saves) with latest_checkpointed_iteration.txt; prints the iter dir.
  hf_logits --export CKPT_ITER_DIR OUT
      export_hf(): OUT/config.json and OUT/model.safetensors.
  hf_logits --logits CKPT_ITER_DIR TOKEN...
      loads the checkpoint's weight section by tensor name into a one-process model (every
      tensor's CRC verified), runs gpt_forward on the tokens (B = 1, T = their number) and
      prints the logits: one line per position, vocab_size numbers, %.9g.
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
                 "--logits CKPT_ITER_DIR TOKEN...", why);
}

static int int_arg(int argc, char** argv, int* i) {
    if (*i + 1 >= argc) usage_error("a flag is missing its value");
    return atoi(argv[++*i]);
}

// ----------------------------------------------------------------------------
// a checkpoint written by hand, in the format of train.c's checkpoint_save

static void write_section_tensor(FILE* f, const float* x, size_t n, uint32_t* crc) {
    if (fwrite(x, sizeof(float), n, f) != n) fail("writing tensors.bin: %s", strerror(errno));
    *crc = crc32_update(0, x, n * sizeof(float));
}

static void make_checkpoint(int argc, char** argv) {
    const char* dir = argv[2];
    GPTConfig c;
    memset(&c, 0, sizeof(c));
    c.num_layers = 2;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.ffn_hidden_size = 96;   // not 4 x hidden: the export must carry n_inner
    c.max_position_embeddings = 20;
    c.vocab_size = 257;
    c.make_vocab_size_divisible_by = 128;   // 384 rows, 127 of them padding that is not exported
    c.init_method_std = 0.02f;
    c.seed = 1234;
    float perturb = 0.3f;
    int iteration = 100;
    for (int i = 3; i < argc; i++) {
        const char* f = argv[i];
        if (!strcmp(f, "--seed")) c.seed = (uint64_t)int_arg(argc, argv, &i);
        else if (!strcmp(f, "--num-layers")) c.num_layers = int_arg(argc, argv, &i);
        else if (!strcmp(f, "--hidden-size")) c.hidden_size = int_arg(argc, argv, &i);
        else if (!strcmp(f, "--num-attention-heads")) c.num_attention_heads = int_arg(argc, argv, &i);
        else if (!strcmp(f, "--ffn-hidden-size")) c.ffn_hidden_size = int_arg(argc, argv, &i);
        else if (!strcmp(f, "--max-position-embeddings")) c.max_position_embeddings = int_arg(argc, argv, &i);
        else if (!strcmp(f, "--vocab-size")) c.vocab_size = int_arg(argc, argv, &i);
        else if (!strcmp(f, "--make-vocab-size-divisible-by")) c.make_vocab_size_divisible_by = int_arg(argc, argv, &i);
        else if (!strcmp(f, "--iteration")) iteration = int_arg(argc, argv, &i);
        else if (!strcmp(f, "--embed-layernorm")) c.embed_layernorm = 1;
        else if (!strcmp(f, "--perturb")) {
            if (i + 1 >= argc) usage_error("--perturb needs a value");
            perturb = (float)atof(argv[++i]);
        } else usage_error(f);
    }
    c.seq_length = c.max_position_embeddings;
    c.padded_vocab_size = padded_vocab_size(c.vocab_size, c.make_vocab_size_divisible_by, 1);
    GPT m;
    gpt_build(&m, &c, 1, c.seq_length, 0, 1, 0, 1, 1, 1);
    // perturb every parameter (rows below valid_rows: the padding stays zero), keyed like the init
    float* params = (float*)mallocCheck(m.num_params * sizeof(float));
    dev_floatX_to_floats(params, m.params, m.num_params);
    for (int i = 0; i < m.num_tensors; i++) {
        const TensorDesc* t = &m.tensors[i];
        float* p = params + t->offset;
        uint64_t key = hash_name(t->name) ^ 0x5eed;
        for (size_t k = 0; k < (size_t)t->valid_rows * t->cols; k++) p[k] += perturb * normal_at(c.seed, key, k);
    }
    // the sections: the weights, and made-up Adam moments so that all three are real data
    CanonicalLayout L = canonical_layout(&c);
    char iter[4200], path[4400];
    mkdir(dir, 0755);
    iter_dir(iter, sizeof(iter), dir, iteration);
    if (mkdir(iter, 0755) != 0 && errno != EEXIST) fail("cannot create %s: %s", iter, strerror(errno));
    snprintf(path, sizeof(path), "%s/tensors.bin", iter);
    FILE* f = fopen(path, "wb");
    if (!f) fail("cannot write %s: %s", path, strerror(errno));
    uint32_t* crc = (uint32_t*)mallocCheck(3 * L.whole.num_tensors * sizeof(uint32_t));
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < m.num_tensors; i++) {
            const TensorDesc* t = &m.tensors[i];
            size_t n = (size_t)t->valid_rows * t->cols;
            if (strcmp(t->name, L.whole.tensors[i].name) != 0) fail("table order differs at %s", t->name);
            float* x = (float*)mallocCheck(n * sizeof(float));
            for (size_t e = 0; e < n; e++) {
                float w = params[t->offset + e];
                float r = normal_at(c.seed + 1, hash_name(t->name), e);
                x[e] = k == 0 ? w : k == 1 ? 1e-3f * r : 1e-6f * r * r;
            }
            write_section_tensor(f, x, n, &crc[3 * i + k]);
            free(x);
        }
    fclose(f);
    snprintf(path, sizeof(path), "%s/metadata.txt", iter);
    f = fopen(path, "w");
    if (!f) fail("cannot write %s: %s", path, strerror(errno));
    fprintf(f, "gridgpt-checkpoint 1\niteration %d\nconsumed_samples %d\nscheduler_samples %d\noptimizer_step %d\n"
            "consumed_valid_samples 0\n", iteration, 32 * iteration, 32 * iteration, iteration);
    fprintf(f, "config num_layers %d\nconfig hidden_size %d\nconfig num_attention_heads %d\nconfig ffn_hidden_size %d\n"
            "config seq_length %d\nconfig max_position_embeddings %d\nconfig vocab_size %d\n"
            "config make_vocab_size_divisible_by %d\nconfig embed_layernorm %d\nconfig init_method_std %.9g\n"
            "config seed %llu\n", c.num_layers, c.hidden_size, c.num_attention_heads, c.ffn_hidden_size, c.seq_length,
            c.max_position_embeddings, c.vocab_size, c.make_vocab_size_divisible_by, c.embed_layernorm,
            c.init_method_std, (unsigned long long)c.seed);
    for (int k = 0; k < 3; k++) fprintf(f, "section %s %zu %zu\n", SECTION_NAMES[k], k * L.section_bytes, L.section_bytes);
    for (int i = 0; i < L.whole.num_tensors; i++) {
        const TensorDesc* d = &L.whole.tensors[i];
        fprintf(f, "tensor %s %d %d %zu %08x %08x %08x\n", d->name, d->valid_rows, d->cols, L.offset[i], crc[3 * i],
                crc[3 * i + 1], crc[3 * i + 2]);
    }
    fclose(f);
    snprintf(path, sizeof(path), "%s/latest_checkpointed_iteration.txt", dir);
    f = fopen(path, "w");
    if (!f) fail("cannot write %s: %s", path, strerror(errno));
    fprintf(f, "%d\n", iteration);
    fclose(f);
    printf("%s\n", iter);
    free(crc);
    free(params);
    free_layout(&L);
    gpt_free(&m);
}

// ----------------------------------------------------------------------------
// our logits for a token sequence, from a checkpoint's weights

static void print_logits(int argc, char** argv) {
    char err[1024];
    CheckpointMeta ck;
    if (checkpoint_meta_read(argv[2], &ck, err, sizeof(err)) != 0) input_error(err);
    const GPTConfig* c = &ck.cfg;
    int T = argc - 3;
    if (T < 1 || T > c->max_position_embeddings) usage_error("give 1 to max_position_embeddings tokens");
    GPT m;
    gpt_build(&m, c, 1, T, 0, 1, 0, 1, 1, 1);
    FILE* bin = fopen(ck.bin_path, "rb");
    if (!bin) input_error(strerror(errno));
    for (int i = 0; i < m.num_tensors; i++) {
        const TensorDesc* d = &m.tensors[i];
        int j = 0;
        while (j < ck.num_tensors && strcmp(ck.tensors[j].name, d->name) != 0) j++;
        if (j == ck.num_tensors) input_error(d->name);
        float* host = (float*)callocCheck(d->numel, sizeof(float));   // vocabulary padding rows stay zero
        if (ckpt_read_tensor(&ck, bin, j, host, err, sizeof(err)) != 0) input_error(err);
        floats_to_dev_floatX(m.params + d->offset, host, d->numel);
        free(host);
    }
    fclose(bin);
    for (int t = 0; t < T; t++) {
        int tok = atoi(argv[3 + t]);
        if (tok < 0 || tok >= c->vocab_size) usage_error("a token is outside the vocabulary");
        m.slots[0].tokens[t] = tok;
        m.slots[0].targets[t] = 0;
    }
    gpt_forward(&m, 0);
    float* logits = (float*)mallocCheck((size_t)T * m.vocab_local * sizeof(float));
    dev_floatX_to_floats(logits, m.logits, (size_t)T * m.vocab_local);
    for (int t = 0; t < T; t++) {
        for (int v = 0; v < c->vocab_size; v++) printf(v ? " %.9g" : "%.9g", logits[(size_t)t * m.vocab_local + v]);
        printf("\n");
    }
    free(logits);
    gpt_free(&m);
    checkpoint_meta_free(&ck);
}

int main(int argc, char** argv) {
    grid_start(&argc, &argv);
    grid_build(1, 1);
    if (argc >= 3 && !strcmp(argv[1], "--make-checkpoint")) make_checkpoint(argc, argv);
    else if (argc == 4 && !strcmp(argv[1], "--export")) {
        char err[1024];
        if (export_hf(argv[2], argv[3], err, sizeof(err)) != 0) input_error(err);
        printf("exported %s to %s\n", argv[2], argv[3]);
    } else if (argc >= 4 && !strcmp(argv[1], "--logits")) print_logits(argc, argv);
    else usage_error("no mode given");
    grid_finish();
    return 0;
}
