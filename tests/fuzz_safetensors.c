/*
tests/fuzz_safetensors.c — a libFuzzer target for hf.h's safetensors reader (issue 45): the
8-byte header length, the JSON header (json.h), each tensor's dtype, shape and data_offsets,
and the layout of the data (st_read_header, as --import-hf calls it).

An input is one model.safetensors, written to a private folder on tmpfs (/dev/shm, else $TMPDIR
or /tmp) and read with st_read_header. What must hold, whatever the bytes:
  - a refused file leaves one line in err, "<file>: <what is wrong>";
  - an accepted one has every tensor inside the file, after the header, its byte count its
    elements times its dtype's size, the tensors back to back from the data's first byte to the
    file's last, no name twice; and every tensor reads back as fp32 (st_read_floats), which
    AddressSanitizer watches.
A broken rule aborts, which libFuzzer reports as a crash with the input that caused it.

    W="-Wall -Wextra -Werror -Wno-unused-function"   # (the trainer's own entry points go unused here)
    clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $W \
        $(mpicc --showme:compile) tests/fuzz_safetensors.c -o fuzz_safetensors $(mpicc --showme:link) -lz -lm
    clang -std=gnu11 -O1 -DFUZZ_SEED_MAIN $W $(mpicc --showme:compile) tests/fuzz_safetensors.c \
        -o fuzz_safetensors_seeds $(mpicc --showme:link) -lz -lm
    ./fuzz_safetensors_seeds tests/data/hostile/hf corpus   # the seed corpus
    ./fuzz_safetensors -max_total_time=30 corpus

With FUZZ_SEED_MAIN defined, the program writes the seed corpus instead: each NAME/model.safetensors
under the folder given (the hostile model directories), and one file with a tensor of each dtype.
*/
#define TESTING
#define FUZZ_NAME "fuzz_safetensors"
#include "fuzz.h"
#include "../train.c"   // hf.h's reader and everything below it (no main: TESTING)

static char st_path_in[4200];

// the input's file, in the private folder
static void make_work_dir(void) {
    if (!st_path_in[0]) snprintf(st_path_in, sizeof st_path_in, "%s/model.safetensors", fuzz_work_dir());
}

// the reader's promises about an accepted file of `size` bytes
static void check_accepted(HFModel* hm, uint64_t size) {
    uint64_t header = 0, next;
    uint8_t le[8];
    if (pread_all(hm->files[0].fd, le, 8, 0) != 0) fuzz_fail(st_path_in, "cannot read its length again");
    for (int b = 7; b >= 0; b--) header = header << 8 | le[b];
    next = 8 + header;
    int n = hm->num_tensors;
    int* order = (int*)mallocCheck((n + 1) * sizeof(int));
    for (int i = 0; i < n; i++) order[i] = i;
    st_sorted_base = hm->tensors;
    qsort(order, n, sizeof(int), st_by_position);
    for (int i = 0; i < n; i++) {
        const StTensor* t = &hm->tensors[order[i]];
        if (t->bytes != t->numel * (uint64_t)ST_DTYPE_BYTES[t->dtype]) fuzz_fail(t->name, "bytes are not numel x dtype size");
        if (t->at != next) fuzz_fail(t->name, "an accepted tensor does not begin where the one before ends");
        next = t->at + t->bytes;
        if (i && !strcmp(t->name, hm->tensors[order[i - 1]].name) && t->bytes) fuzz_fail(t->name, "one name twice");
    }
    if (next != size) fuzz_fail(st_path_in, "accepted with bytes after the last tensor");
    free(order);
    char err[8192];
    for (int i = 0; i < n; i++) {   // every tensor reads back (ASan watches the buffers)
        const StTensor* t = &hm->tensors[i];
        float* out = (float*)mallocCheck(t->numel * sizeof(float) + 1);
        void* scratch = mallocCheck(t->numel * 2 + 1);
        if (st_read_floats(hm, t, out, scratch, err, sizeof err)) fuzz_fail(t->name, err);
        free(out);
        free(scratch);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    make_work_dir();
    fuzz_write_file(st_path_in, data, size);
    HFModel hm;
    memset(&hm, 0, sizeof hm);
    hm.dir = fuzz_dir;
    char err[8192] = {0};
    int rc = st_read_header(&hm, "model.safetensors", err, sizeof err);
    if (rc != 0 && (err[0] == 0 || strncmp(err, st_path_in, strlen(st_path_in)) != 0 || strchr(err, '\n')))
        fuzz_fail("error line is not \"<file>: ...\"", err);
    if (rc == 0) check_accepted(&hm, size);
    hf_model_free(&hm);
    unlink(st_path_in);
    return 0;
}

#ifdef FUZZ_SEED_MAIN
// ----------------------------------------------------------------------------
// the seed corpus

static void copy_file(const char* from, const char* to) {
    size_t len;
    char err[4400];
    char* text = read_small_file(from, 1 << 20, &len, err, sizeof err);
    if (!text) fuzz_fail(from, err);
    fuzz_write_file(to, (const uint8_t*)text, len);
    free(text);
}

// one tensor of each dtype, back to back
static void write_dtypes_seed(const char* to) {
    const char* header = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                         "\"b\":{\"dtype\":\"F16\",\"shape\":[2,1],\"data_offsets\":[8,12]},"
                         "\"c\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[12,14]},"
                         "\"d\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[14,14]}}";
    uint8_t buf[512] = {0};
    uint64_t n = strlen(header);
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)(n >> (8 * b));
    memcpy(buf + 8, header, n);
    for (int k = 0; k < 14; k++) buf[8 + n + k] = (uint8_t)(k * 37 + 1);
    fuzz_write_file(to, buf, 8 + n + 14);
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s HOSTILE_HF_DIR OUT_DIR\n", argv[0]);
        return 2;
    }
    char from[4400], to[4400];
    mkdir(argv[2], 0755);
    DIR* d = opendir(argv[1]);
    if (!d) fuzz_fail(argv[1], strerror(errno));
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        snprintf(from, sizeof from, "%s/%s/model.safetensors", argv[1], e->d_name);
        if (e->d_name[0] == '.' || access(from, R_OK) != 0) continue;
        snprintf(to, sizeof to, "%s/%s", argv[2], e->d_name);
        copy_file(from, to);
    }
    closedir(d);
    snprintf(to, sizeof to, "%s/dtypes", argv[2]);
    write_dtypes_seed(to);
    return 0;
}
#endif
