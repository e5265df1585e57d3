// tests/sass_launches.cpp — for tests/test_sass.py: how kernels/flash_attention.cuh's attention launchers
// launch the fused attention's kernels (threads per block, dynamic shared memory), which no
// compiler output says. Built by g++ against the CUDA emulation (tests/emu/), with LAUNCH
// replaced by a recorder that runs nothing: the real launchers (attention_forward and
// attention_backward, on the fused path) are called for every head size 16, 32, ..., 128,
// with ALiBi and without, and each launch prints one line
//     launch KERNEL THREADS DYNAMIC_SHARED_BYTES hs=HS alibi=0|1 dropout=0|1
// KERNEL is the launched function's name without its parameters, as the symbol table gives
// it (a template instance shows its arguments: attention_forward_flash_kernel<64>), the form
// test_sass.py gives the cubin's kernels. A head size the launchers refuse prints
//     refused hs=HS: THE LAUNCHER'S MESSAGE
#include <cuda_runtime.h>   // the emulation's: it defines LAUNCH, replaced here before kernels.cuh
#include <cxxabi.h>
#include <dlfcn.h>
#include <setjmp.h>
#include <string>

static std::string launched_name(void* kernel, const char* as_written);
static int probed_hs, probed_alibi, probed_dropout;

// the launch's grid and arguments are evaluated or type-checked (the arguments in a lambda
// that is never called), so nothing the launcher computes for them goes unused; +(kernel) is
// the kernel's address whether the launcher names the kernel or holds it in a pointer
#undef LAUNCH
#define LAUNCH(kernel, blocks, block, shmem, ...)                                                                     \
    do {                                                                                                              \
        auto launch_not_run_ = [&]() { kernel(__VA_ARGS__); };                                                        \
        (void)launch_not_run_;                                                                                        \
        (void)(blocks);                                                                                               \
        printf("launch %s %u %zu hs=%d alibi=%d dropout=%d\n", launched_name(reinterpret_cast<void*>(+(kernel)), #kernel).c_str(), \
               (unsigned)(block), (size_t)(shmem), probed_hs, probed_alibi, probed_dropout);                        \
    } while (0)
#include "kernels.cuh"

// The symbol at the kernel's address (the program is linked with -rdynamic), demangled, up to
// its parameter list. A kernel the dynamic symbol table does not name exactly (a static one)
// is reported as written at the launch, with a '?' in front: test_sass.py then lacks its size.
static std::string launched_name(void* kernel, const char* as_written) {
    Dl_info info;
    if (!dladdr(kernel, &info) || info.dli_saddr != kernel || !info.dli_sname) return std::string("?") + as_written;
    int status;
    char* demangled = abi::__cxa_demangle(info.dli_sname, NULL, NULL, &status);
    std::string name = status == 0 ? demangled : info.dli_sname;
    free(demangled);
    int depth = 0;   // cut at the '(' outside any template argument list; drop a return type
    size_t start = 0;
    for (size_t i = 0; i < name.size(); i++) {
        char c = name[i];
        if (c == '<') depth++;
        else if (c == '>') depth--;
        else if (c == ' ' && depth == 0) start = i + 1;
        else if (c == '(' && depth == 0) return name.substr(start, i - start);
    }
    return name.substr(start);
}

// a launcher's refusal (check_flash_head_size calls fail) comes back here instead of exiting
static jmp_buf refused;
static void refuse(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("refused hs=%d: ", probed_hs);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    longjmp(refused, 1);
}

static void* device_buffer(size_t bytes) {
    void* p;
    cudaCheck(cudaMalloc(&p, bytes));
    return p;
}

int main(void) {
    const int B = 1, T = 256, NH = 1, G = 1;
    fail = refuse;
    for (probed_dropout = 0; probed_dropout <= 1; probed_dropout++)
    for (probed_alibi = 0; probed_alibi <= 1; probed_alibi++)
        for (probed_hs = 16; probed_hs <= 128; probed_hs += 16) {
            size_t rows = (size_t)B * T, HS = probed_hs;
            floatX* qkv = (floatX*)device_buffer(rows * (NH + 2 * G) * HS * sizeof(floatX));
            floatX* dqkv = (floatX*)device_buffer(rows * (NH + 2 * G) * HS * sizeof(floatX));
            floatX* out = (floatX*)device_buffer(rows * NH * HS * sizeof(floatX));
            floatX* dout = (floatX*)device_buffer(rows * NH * HS * sizeof(floatX));
            float* lse = (float*)device_buffer((size_t)B * NH * T * sizeof(float));
            floatX* scratch = (floatX*)device_buffer(rows * 4 * NH * HS * sizeof(float));   // more than D needs
            Alibi alibi = {0, probed_alibi ? NH : 0};
            Dropout dropout = probed_dropout ? dropout_mask(0.1f, 1234, 1, 0, DROPOUT_ATTENTION_PROBS, 0, 0) : NO_DROPOUT;
            if (setjmp(refused) == 0) {
                attention_forward(out, NULL, lse, scratch, qkv, B, T, NH, G, probed_hs, alibi, dropout);
                attention_backward(dqkv, scratch, dout, qkv, out, NULL, lse, B, T, NH, G, probed_hs, alibi, dropout);
            }
            for (void* p : {(void*)qkv, (void*)dqkv, (void*)out, (void*)dout, (void*)lse, (void*)scratch}) cudaCheck(cudaFree(p));
        }
    return 0;
}
