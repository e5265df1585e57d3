/*
convert.h — the Hugging Face conversions, run instead of training.

  - --load DIR --export-hf OUT: DIR's latest checkpoint as a transformers model (hf.h's
    export), with the tokenizer's files when --tokenizer-type names them;
  - --import-hf DIR --save CKPT: a transformers model as CKPT/iter_0000000 (hf_import.h),
    which any grid then --loads.
No data, no model: rank 0 converts, the others end with it; a stop signal (stop_signals.h)
ends a conversion between tensors, its files removed, and the status is 128 + the signal.

Interface (what train.c uses): export_and_exit, import_and_exit. It sits on hf.h, hf_import.h,
checkpoint.h, tokenizer.h, config.h's Config and stop_signals.h.
*/
#pragma once

// ----------------------------------------------------------------------------
// the conversions

// --load DIR --export-hf OUT: the latest checkpoint in DIR as a transformers model, with the
// tokenizer's files when --tokenizer-type GPT2BPETokenizer names them (a checkpoint does not
// record its tokenizer); 0, or 1 with the error line in err
static int export_latest(const Config* a, char* err, size_t len) {
    char ckpt[4300];
    HFArchitecture arch = (HFArchitecture)a->export_hf_architecture;
    HFTokenizer hf_tok = {NULL, NULL, 0, -1};   // (none)
    Tokenizer tok;
    double t0 = now_seconds();
    if (!a->load) return error_line(err, len, "--export-hf needs --load DIR (the checkpoint to export)");
    if (latest_checkpoint(a->load, ckpt, sizeof(ckpt), err, len)) return 1;
    if (!ckpt[0]) return error_line(err, len, "--load %s: no latest_checkpointed_iteration.txt, nothing to export", a->load);
    if (a->tokenizer_type == TOKENIZER_GPT2_BPE) {   // loaded whole, so that a file it would refuse is not exported
        if (tokenizer_load(&tok, a->vocab_file, a->merge_file, err, len) != 0) return 1;
        hf_tok = (HFTokenizer){a->vocab_file, a->merge_file, tok.vocab_size, tok.eod};
        tokenizer_free(&tok);
    }
    if (export_hf(ckpt, a->export_hf, &arch, &hf_tok, &stop_requested, err, len) != 0) return 1;
    printf("exported %s as a Hugging Face %s to %s (config.json, model.safetensors, generation_config.json%s) in %.2f s\n",
           ckpt, hf_class_name(arch), a->export_hf, hf_tok.vocab_file ? ", the tokenizer's four files" : "",
           now_seconds() - t0);
    if (!hf_tok.vocab_file)
        printf("note: no tokenizer files in %s (a checkpoint does not record its tokenizer): add --tokenizer-type "
               "GPT2BPETokenizer --vocab-file VOCAB.json --merge-file MERGES.txt to write vocab.json, merges.txt, "
               "tokenizer_config.json and special_tokens_map.json\n", a->export_hf);
    return 0;
}

// A stop signal during a conversion (rank 0's err set by it): its files were removed; said in
// one line, and the status is 128 + the signal, as a signal during start-up
static void exit_if_conversion_stopped(const char* flag, const char* err) {
    if (!stop_requested || !err[0]) return;
    fprintf(stderr, "stopped by %s during %s, which removed what it had written\n", signal_name(stop_requested), flag);
    exit(128 + stop_requested);
}

// no data, no model, just the file conversion, by rank 0 alone (the others end with it)
static void export_and_exit(const Config* a) {
    char err[4600] = "";
    on_stop_signals(request_stop);   // a signal ends the export between tensors, its files removed
    if (grid.world_rank == 0) export_latest(a, err, sizeof(err));
    exit_if_conversion_stopped("--export-hf", err);
    config_error_anywhere(err);
    grid_finish();
    exit(0);
}

// --import-hf DIR --save CKPT: a transformers model as CKPT/iter_0000000 (iteration 0, a fresh
// optimizer), which any grid then --loads (and --finetune). Like the export, no data, no
// model: rank 0 converts, the others end with it. The model is config.json's: of the model
// flags only --seq-length may be given (else the model's own length).
static void import_and_exit(const Config* a) {
    char err[4600] = "", flag[96];
    if (!a->save) config_error("--import-hf %s needs --save DIR (where the imported checkpoint is written)", a->import_hf);
    for (int k = 0; k < NUM_MODEL_FIELDS; k++)
        if (a->model_given[k] && MODEL_FIELDS[k].offset != offsetof(GPTConfig, seq_length))
            config_error("--import-hf takes the model from %s/config.json: drop %s (only --seq-length may be given)",
                         a->import_hf, flag_of(&MODEL_FIELDS[k], flag, sizeof(flag)));
    int seq_length = model_field_given(a, offsetof(GPTConfig, seq_length)) ? a->model.seq_length : 0;
    double t0 = now_seconds();
    HFImport got;
    on_stop_signals(request_stop);   // a signal ends the import between tensors, its files removed
    if (grid.world_rank == 0 &&
        import_hf(a->import_hf, a->save, seq_length, a->import_hf_dropout, &stop_requested, &got, err, sizeof(err)) == 0) {
        const GPTConfig* c = &got.cfg;
        printf("imported %s as %s: %d layers, hidden %d, %d heads, vocabulary %d, sequence length %d; %s, %d tensors "
               "from %d file%s; wrote %s in %.2f s\n", a->import_hf, hf_class_name(got.arch), c->num_layers, c->hidden_size,
               c->num_attention_heads, c->vocab_size, c->seq_length, got.dtypes, got.tensors, got.files,
               got.files > 1 ? "s" : "", got.checkpoint, now_seconds() - t0);
        for (char* line = strtok(got.note, "\n"); line; line = strtok(NULL, "\n")) printf("note: %s\n", line);
        fflush(stdout);
    }
    exit_if_conversion_stopped("--import-hf", err);
    config_error_anywhere(err);
    grid_finish();
    exit(0);
}
